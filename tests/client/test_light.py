"""``LightClient`` (``dynamod.client.light``: gRPC's calls over our own HTTP/2, no event loop)
against a real dynamod and a real worker, call by call beside ``AsyncClient``: the same
results, the same errors by class and message, and what it leaves to ``AsyncClient``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from dynamod.client import AsyncClient, Credentials
from dynamod.client.light import LightClient
from dynamod.errors import DynamoError
from dynamod.taints import TaintUpdate
from dynamod.targets import Target
from tests.client.test_client import seen_by_daemon
from tests.support.processes import Proc, daemon, running, worker

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[tuple[Proc, str]]:
    """A worker tainted pool=a, and a dynamod that sees it; yields the worker and the
    daemon's endpoint."""
    store = (tmp_path / "store").as_uri()
    socket = tmp_path / "dynamod.sock"
    async with (
        running(worker(store, "--taint", "pool=a")) as proc,
        running(daemon(store, socket)),
    ):
        await seen_by_daemon(socket)
        yield proc, f"unix://{socket}"


def opened(endpoint: str) -> LightClient:
    client = LightClient(endpoint, credentials=Credentials(), timeout=10)
    assert client.open(), "the light client could not connect"
    return client


async def both(endpoint: str, call: Callable[[Any], Awaitable[Any]]) -> tuple[Any, Any]:
    """``call`` on each client: its result, or the error it raised (class and message)."""
    found = []
    async with AsyncClient(endpoint, credentials=Credentials(), timeout=10) as slow:
        for client in (slow, opened(endpoint)):
            try:
                found.append(await call(client))
            except DynamoError as exc:
                found.append((type(exc), str(exc)))
            finally:
                if isinstance(client, LightClient):
                    client.close()
    return found[0], found[1]


async def pages(client: Any, **query: Any) -> list[Any]:
    return [page async for page in client.stream_workers(**query)]


async def changes(client: Any, update: TaintUpdate, target: Target) -> list[Any]:
    return [c async for c in client.stream_update_taints(update, target, dry_run=True)]


async def test_each_call_answers_as_the_grpc_clients_does(fleet: tuple[Proc, str]) -> None:
    proc, endpoint = fleet
    wid = proc.field("id")
    add = TaintUpdate.add(["light/x"])
    calls: list[Callable[[Any], Awaitable[Any]]] = [
        lambda c: c.list_workers(),
        lambda c: c.list_workers(selector="pool=a", fields=["id", "taints"]),
        lambda c: pages(c),
        lambda c: pages(c, model="nothing"),
        lambda c: c.id_prefix(),
        lambda c: c.list_policies(),
        lambda c: c.update_taints(add, Target(worker=wid), dry_run=True),
        lambda c: c.update_taints(add, Target(selector="pool=a"), dry_run=True),
        lambda c: changes(c, add, Target(all=True)),
        # The daemon's errors, by class and message.
        lambda c: c.update_taints(add, Target(worker="nosuchworker")),
        lambda c: c.update_taints(TaintUpdate.add(["dynamo.topology/zone=x"]), Target(worker=wid)),
        lambda c: c.update_taints(add, Target(worker=wid, expect_revision=10**6)),
        lambda c: c.list_workers(selector="!!"),
    ]
    for index, call in enumerate(calls):
        slow, light = await both(endpoint, call)
        assert light == slow, index


async def test_a_write_through_it_is_what_the_daemon_then_lists(fleet: tuple[Proc, str]) -> None:
    proc, endpoint = fleet
    wid = proc.field("id")
    client = opened(endpoint)
    try:
        (done,) = await client.update_taints(TaintUpdate.add(["light/y"]), Target(worker=wid))
        assert done.changed and "light/y" in done.after
    finally:
        client.close()
    async with AsyncClient(endpoint, credentials=Credentials(), timeout=10) as slow:
        workers, _ = await slow.list_workers(selector="light/y")
    assert [w.id for w in workers] == [wid]


async def test_what_it_is_not_sure_of_is_left_to_the_grpc_client(tmp_path: Path) -> None:
    """Nothing is sent where gRPC's client would say something else: no socket, a target
    gRPC's own resolver reads, TLS without a CA of ours."""
    gone = LightClient(f"unix://{tmp_path}/none.sock", credentials=Credentials(), timeout=5)
    assert not gone.open()
    assert not LightClient("dns:///localhost:1", credentials=Credentials(), timeout=5).open()
    assert not LightClient("127.0.0.1:1", credentials=Credentials(tls=True), timeout=5).open()


async def test_a_connection_made_but_never_answered_is_gRPCs_deadline(tmp_path: Path) -> None:
    """A socket that takes the connection and says nothing: the daemon cannot be reached,
    in gRPC's words for a deadline, within the timeout."""
    held: list[asyncio.StreamWriter] = []  # kept open, never written to
    server = await asyncio.start_unix_server(
        lambda _, writer: held.append(writer), str(tmp_path / "mute.sock")
    )
    async with server:
        endpoint = f"unix://{tmp_path}/mute.sock"
        slow_error = None
        async with AsyncClient(endpoint, credentials=Credentials(), timeout=1) as slow:
            try:
                await slow.list_workers()
            except DynamoError as exc:
                slow_error = (type(exc), str(exc))
        light = LightClient(endpoint, credentials=Credentials(), timeout=1)
        with pytest.raises(DynamoError) as raised:
            await asyncio.to_thread(light.open)
        for writer in held:
            writer.close()
    assert (type(raised.value), str(raised.value)) == slow_error
