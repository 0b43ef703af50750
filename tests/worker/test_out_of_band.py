"""The immutable boundary at the writer, with real processes on every shared store: a worker
whose record is rewritten outside its taints writes it back (keeping its latest valid
taints) and logs it, and its route never answers ok for a write routers would ignore."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from dynamod.client import AsyncClient, Credentials
from dynamod.errors import RevisionMismatchError
from dynamod.records import WorkerRecord
from dynamod.store import KEEP, Put, Store
from tests.support.processes import Proc, daemon, running, worker
from tests.worker.test_worker_process import post_taints

pytestmark = pytest.mark.timeout(120)

TOPOLOGY = "dynamo.topology/zone=a"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def rewrite(store: Store, key: str, value: bytes) -> int:
    """Write ``value`` over the record at ``key`` as an operator's etcdctl would (same lease).

    The worker may still be writing its record back over the previous round's change
    (its restore and its taint write both land after the route answers), so a compare that
    loses to it reads again, as an operator's retry would."""
    while True:
        entry = await store.get(key)
        assert entry is not None
        try:
            return await store.put(key, value, expect=entry.revision, lease=KEEP)
        except RevisionMismatchError:
            continue


async def restored(store: Store, key: str, after: int) -> WorkerRecord:
    """The first readable record written at ``key`` after revision ``after``."""
    async with asyncio.timeout(30), store.watch(key, since=after) as events:
        async for event in events:
            if isinstance(event, Put) and event.revision > after:
                return WorkerRecord.from_bytes(event.entry.value)
    raise AssertionError("the watch ended")


def moved(record: WorkerRecord) -> bytes:
    """``record`` pointing at another address: outside its taints, so routers ignore it."""
    return dataclasses.replace(record, address="http://203.0.113.9:1").to_bytes()


async def daemon_view(socket: Path, worker_id: str) -> WorkerRecord:
    async with AsyncClient(f"unix://{socket}", credentials=Credentials()) as client:
        return (await client.worker(worker_id)).record


@pytest.mark.parametrize("garbage", [False, True], ids=["moved", "unreadable"])
async def test_a_record_changed_outside_its_taints_is_written_back(
    shared_store: Store, shared_store_url: str, garbage: bool
) -> None:
    args = ("--taint", "capacity/fast", "--topology", "zone=a")
    async with running(worker(shared_store_url, *args)) as proc:
        key = proc.field("key")
        entry = await shared_store.get(key)
        assert entry is not None
        original = WorkerRecord.from_bytes(entry.value)
        bad = await rewrite(shared_store, key, b"{not a record" if garbage else moved(original))
        back = await restored(shared_store, key, bad)
        assert back == original
        await proc.logged("restored its record")
        assert f"over the out-of-band change at revision {bad}" in proc.stderr


async def test_the_route_never_answers_ok_for_a_write_routers_ignore(
    shared_store: Store, shared_store_url: str, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """The update races the worker's own restore: whichever lands first, what the route
    reports is what the daemon ends up routing on, at the registered address."""
    socket = tmp_path / "dynamod.sock"
    args = ("--taint", "capacity/fast", "--topology", "zone=a")
    async with (
        running(worker(shared_store_url, *args)) as proc,
        running(daemon(shared_store_url, socket)),
    ):
        key = proc.field("key")
        entry = await shared_store.get(key)
        assert entry is not None
        original = WorkerRecord.from_bytes(entry.value)
        await seen(socket, proc)
        for round_ in range(5):
            wanted = [f"round={round_}"]
            await rewrite(shared_store, key, moved(original))
            status, reply = await post_taints(http, proc, {"taints": wanted})
            assert (status, reply) == (200, {"status": "ok", "taints": wanted})
            await routed_on(socket, proc, (TOPOLOGY, *wanted))
            view = await daemon_view(socket, proc.field("id"))
            assert view.address == original.address
        stored = await shared_store.get(key)
        assert stored is not None
        assert WorkerRecord.from_bytes(stored.value).address == original.address


async def seen(socket: Path, proc: Proc) -> None:
    await routed_on(socket, proc, ("capacity/fast", TOPOLOGY))


async def routed_on(socket: Path, proc: Proc, taints: tuple[str, ...]) -> None:
    """Wait until dynamod's view shows exactly ``taints`` (sorted) on the worker."""
    async with AsyncClient(f"unix://{socket}", credentials=Credentials()) as client:
        async with asyncio.timeout(30):
            async for event in client.events():
                for info in (*event.workers, event.worker):
                    if info is not None and info.id == proc.field("id") and info.taints == taints:
                        return
