"""Concurrent writers to one worker, with real processes on etcd, NATS and the file store.

* 64 ``dynamoctl taints add`` processes at once through one dynamod: all 64 succeed, all
  64 taints are there (the daemon serialises updates per worker).
* 100 replaces at once on the worker's own route: 100 answers 200 (one lock in the worker), and
  the record ends as the last of them in the worker's audit log.
* Four dynamods and the route writing the same worker for ``DYNAMO_WRITERS_SECONDS``
  (30 s): nothing is lost — the successful updates of all five writers, ordered by the
  revision they wrote, form one chain in which each started from what the one before left,
  and the record ends as the last left it — and every conflict that remains is reported
  as retryable with the attempts it took.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from bench.load import daemon_caught_up
from dynamod.client import AsyncClient, Credentials
from dynamod.discovery.updates import CAS_ATTEMPTS
from dynamod.errors import ConflictError
from dynamod.records import WorkerRecord
from dynamod.store import Store
from dynamod.taints import caller_taints
from tests.chaos.harness import Figures
from tests.support.processes import Proc, daemon, run_ctl, running, worker

pytestmark = [pytest.mark.etcd, pytest.mark.nats, pytest.mark.timeout(300)]

CLI_WRITERS = 64
ROUTE_WRITERS = 100
DAEMONS = 4
SECONDS = float(os.environ.get("DYNAMO_WRITERS_SECONDS", "30"))


async def record_of(store: Store, key: str) -> tuple[WorkerRecord, int]:
    entry = await store.get(key)
    assert entry is not None
    return WorkerRecord.from_bytes(entry.value), entry.revision


async def test_64_concurrent_dynamoctl_adds_through_one_daemon_all_succeed(
    shared_store: Store, shared_store_url: str, tmp_path: Path, figures: Figures
) -> None:
    socket = tmp_path / "dynamod.sock"
    # 64 dynamoctl processes starting at once hold both cores for seconds: a 2 s lease could
    # lapse for want of CPU, and this test is about writers, not leases.
    calm = worker(shared_store_url, "--lease-ttl", "30")
    async with running(calm) as proc, running(daemon(shared_store_url, socket)):
        worker_id, key = proc.field("id"), proc.field("key")
        added = [f"writer/n{i}" for i in range(CLI_WRITERS)]
        async with asyncio.TaskGroup() as group:
            runs = [
                group.create_task(run_ctl(socket, "taints", "add", worker_id, t)) for t in added
            ]
        failed = [r.result() for r in runs if r.result()[0] != 0]
        assert not failed, failed[:3]
        record, revision = await record_of(shared_store, key)
        assert set(caller_taints(record.taints)) == set(added)
        async with AsyncClient(f"unix://{socket}", credentials=Credentials()) as client:
            await daemon_caught_up(client, revision)
            assert set((await client.worker(worker_id)).caller_taints) == set(added)
    figures.record("processes", CLI_WRITERS)
    figures.record("succeeded", CLI_WRITERS - len(failed))


async def test_100_concurrent_replaces_on_the_route_all_answer_200(
    shared_store: Store, shared_store_url: str, tmp_path: Path
) -> None:
    audit = tmp_path / "audit.log"
    async with running(worker(shared_store_url, "--audit-log", str(audit))) as proc:
        url = proc.field("system") + "/engine/update/model_taints"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

            async def replace(i: int) -> tuple[int, object]:
                async with http.post(url, json={"taints": [f"route=r{i}"]}) as reply:
                    return reply.status, await reply.json()

            answers = await asyncio.gather(*(replace(i) for i in range(ROUTE_WRITERS)))
        assert [status for status, _ in answers] == [200] * ROUTE_WRITERS, answers[:3]
        record, _ = await record_of(shared_store, proc.field("key"))
        assert await proc.stop() == 0
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [line["outcome"] for line in lines] == ["ok"] * ROUTE_WRITERS
    assert_one_chain(lines)
    assert list(record.taints) == lines[-1]["after"]


def assert_one_chain(lines: list[dict[str, object]]) -> None:
    """Successful updates, ordered by the revision each wrote: each began from what the
    previous one left (so no update was computed on a stale set and none was lost)."""
    done = sorted((x for x in lines if x["outcome"] == "ok"), key=lambda x: int(str(x["revision"])))
    revisions = [x["revision"] for x in done]
    assert len(set(revisions)) == len(revisions), "two updates claim one revision"
    for previous, line in itertools.pairwise(done):
        assert line["before"] == previous["after"], (previous, line)


@dataclass
class Tally:
    """What the writers saw: successes, and each conflict's retryability and attempts."""

    ok: int = 0
    conflicts: list[tuple[bool, int | None, str]] = field(default_factory=list)


async def daemon_writer(
    client: AsyncClient, worker_id: str, name: str, tally: Tally, stop: asyncio.Event
) -> None:
    """Add then remove a taint of this writer's own, as fast as the daemon answers."""
    for n in itertools.count():
        if stop.is_set():
            return
        taint = f"{name}/n{n}"
        for update in (client.add_taints, client.remove_taints):
            try:
                await update(worker_id, [taint])
            except ConflictError as exc:
                tally.conflicts.append((exc.retryable, exc.attempts, str(exc)))
            else:
                tally.ok += 1


async def route_writer(url: str, tally: Tally, stop: asyncio.Event) -> None:
    async with aiohttp.ClientSession() as http:
        for n in itertools.count():
            if stop.is_set():
                return
            async with http.post(url, json={"taints": [f"route/n{n}"]}) as reply:
                body = await reply.json()
            if reply.status == 409:
                tally.conflicts.append((body["retryable"], body["attempts"], body["message"]))
            else:
                assert reply.status == 200, body
                tally.ok += 1


@contextlib.asynccontextmanager
async def daemons(store_url: str, root: Path) -> AsyncIterator[list[tuple[Proc, Path]]]:
    procs = []
    async with contextlib.AsyncExitStack() as stack:
        for i in range(DAEMONS):
            home = root / f"d{i}"
            home.mkdir()
            socket = home / "dynamod.sock"  # and its audit.log beside it
            procs.append(
                (await stack.enter_async_context(running(daemon(store_url, socket))), home)
            )
        yield procs


async def test_four_daemons_and_the_route_writing_one_worker_lose_nothing(
    shared_store: Store, shared_store_url: str, tmp_path: Path, figures: Figures
) -> None:
    audit = tmp_path / "worker-audit.log"
    args = ("--topology", "zone=a", "--audit-log", str(audit))
    async with (
        running(worker(shared_store_url, *args)) as proc,
        daemons(shared_store_url, tmp_path) as started,
        contextlib.AsyncExitStack() as stack,
    ):
        worker_id = proc.field("id")
        clients = [
            await stack.enter_async_context(
                AsyncClient(f"unix://{home / 'dynamod.sock'}", credentials=Credentials())
            )
            for _, home in started
        ]
        stop, tally = asyncio.Event(), Tally()
        url = proc.field("system") + "/engine/update/model_taints"
        async with asyncio.TaskGroup() as group:
            for i, client in enumerate(clients):
                for j in range(2):
                    group.create_task(daemon_writer(client, worker_id, f"d{i}w{j}", tally, stop))
            group.create_task(route_writer(url, tally, stop))
            await asyncio.sleep(SECONDS)
            stop.set()
        record, _ = await record_of(shared_store, proc.field("key"))
        assert await proc.stop() == 0
    lines = [json.loads(x) for x in audit.read_text().splitlines()]
    for _, home in started:
        lines += [json.loads(x) for x in (home / "audit.log").read_text().splitlines()]
    done = [x for x in lines if x["outcome"] in ("ok", "unchanged")]
    assert len(done) == tally.ok, "an acknowledged update without its audit line, or one more"
    assert_one_chain(lines)
    last = max((x for x in lines if x["outcome"] == "ok"), key=lambda x: int(x["revision"]))
    assert list(record.taints) == last["after"]
    for retryable, attempts, message in tally.conflicts:
        assert (retryable, attempts) == (True, CAS_ATTEMPTS), message
        assert f"({CAS_ATTEMPTS} attempts)" in message
    figures.record("seconds", SECONDS)
    figures.record("updates acknowledged", tally.ok)
    figures.record("conflicts (retryable, 8 attempts)", len(tally.conflicts))
