"""A drain through a real daemon's gRPC API (in this process, on a unix socket, over a
memory store): ``AsyncClient.drain`` and the blocking ``Client.drain``, the listing's
``state``, the end of a wait by an uncordon and by the daemon's stop. A request in flight
is held on the daemon's own router, as its front holds one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dynamod.client import AsyncClient, Client, Credentials
from dynamod.daemon import Daemon
from dynamod.engine_events import EngineLoad
from dynamod.errors import InvalidInputError, ShuttingDownError, WorkerNotFoundError
from dynamod.records import WorkerRecord
from dynamod.reports import DrainEvent, DrainResult
from dynamod.results import InFlight, WorkerState
from dynamod.router import Assignment, RouteRequest
from dynamod.store import Store
from dynamod.store.memory import MemoryStore
from dynamod.taints import CORDONED, DRAIN_TAINTS, DRAINING, RoutingConstraints, TaintUpdate
from dynamod.targets import Target
from tests.daemon.helpers import add_worker, client_for, running_daemon, settings_for

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def store() -> AsyncIterator[Store]:
    async with MemoryStore() as opened:
        yield opened


@pytest.fixture
async def pair(store: Store) -> list[WorkerRecord]:
    return [
        await add_worker(store, instance_id="aa01", taints=["pool=a"]),
        await add_worker(store, instance_id="bb01", taints=["pool=b"]),
    ]


@pytest.fixture
async def daemon(store: Store, pair: list[WorkerRecord], tmp_path: Path) -> AsyncIterator[Daemon]:
    async with running_daemon(store, settings_for(store, tmp_path)) as running:
        yield running


@pytest.fixture
async def client(daemon: Daemon) -> AsyncIterator[AsyncClient]:
    async with client_for(daemon.settings) as opened:
        yield opened


async def hold(daemon: Daemon, pool: str) -> Assignment:
    """A request in flight on the worker holding ``pool``, as the front would hold it."""
    required = RoutingConstraints(required_taints=frozenset({pool}))
    return await daemon.router.acquire(RouteRequest("llama", required))


class Draining:
    """``client.drain`` running as a task, its wait's events in a queue."""

    def __init__(self, client: AsyncClient, target: Target, timeout: float | None = None):
        self.events: asyncio.Queue[DrainEvent] = asyncio.Queue()
        self.task = asyncio.create_task(
            client.drain(target, timeout=timeout, progress=self.events.put_nowait)
        )

    async def next(self) -> DrainEvent:
        async with asyncio.timeout(10):
            return await self.events.get()

    async def result(self) -> DrainResult:
        async with asyncio.timeout(10):
            return await self.task


async def state_of(client: AsyncClient, worker: str) -> WorkerState | None:
    workers, _ = await client.list_workers(fields=["id", "state"])
    return next(w.state for w in workers if w.id == worker)


async def test_a_drain_cordons_waits_for_the_request_in_flight_and_returns_drained(
    daemon: Daemon, client: AsyncClient
) -> None:
    held = await hold(daemon, "pool=a")
    draining = Draining(client, Target(worker="aa01"))
    (status,) = (await draining.next()).workers
    assert status.state is WorkerState.DRAINING and status.in_flight == InFlight(1)
    assert await state_of(client, "aa01") is WorkerState.DRAINING
    assert await state_of(client, "bb01") is WorkerState.READY
    worker = await client.get_worker("aa01")
    assert set(DRAIN_TAINTS) <= set(worker.taints) and worker.state is WorkerState.DRAINING
    assert not draining.task.done()  # the request is still in flight: nothing can end it
    daemon.router.release(held)
    result = await draining.result()
    assert result.drained and not result.timed_out and result.busy == ()
    (cordoned,) = result.cordoned
    assert cordoned.added == DRAIN_TAINTS
    assert [w.state for w in result.workers] == [WorkerState.DRAINED]
    assert await state_of(client, "aa01") is WorkerState.DRAINED


async def test_the_engines_figures_count_as_in_flight_too(
    daemon: Daemon, client: AsyncClient, pair: list[WorkerRecord]
) -> None:
    key = pair[0].key
    daemon.router.report(key, EngineLoad(running=0, waiting=1))  # another caller's request
    draining = Draining(client, Target(selector="pool=a"), timeout=30)
    (waiting,) = (await draining.next()).workers
    assert waiting.in_flight == InFlight(0, 0, 1) and waiting.state is WorkerState.DRAINING
    daemon.router.report(key, EngineLoad(running=1))
    (running,) = (await draining.next()).workers
    assert running.in_flight == InFlight(0, 1, 0)
    daemon.router.report(key, EngineLoad())
    result = await draining.result()
    assert result.drained
    (status,) = result.workers
    assert status.in_flight == InFlight(0, 0, 0)


async def test_a_timeout_names_what_is_still_in_flight(daemon: Daemon, client: AsyncClient) -> None:
    await hold(daemon, "pool=b")
    result = await client.drain(Target(worker="bb01"), timeout=0.2)
    assert result.timed_out and not result.drained
    (busy,) = result.busy
    assert (busy.worker, busy.in_flight, busy.state) == ("bb01", InFlight(1), WorkerState.DRAINING)
    assert busy.describe() == "draining: router 1, engine not reporting"
    # The worker stays cordoned for the drain: only uncordon ends it.
    assert await state_of(client, "bb01") is WorkerState.DRAINING


async def test_uncordon_ends_a_drain_and_its_wait(daemon: Daemon, client: AsyncClient) -> None:
    held = await hold(daemon, "pool=a")
    draining = Draining(client, Target(worker="aa01"))
    await draining.next()
    (change,) = await client.update_taints(TaintUpdate.remove(DRAIN_TAINTS), Target(worker="aa01"))
    assert set(change.removed) == {CORDONED, DRAINING}
    result = await draining.result()
    assert not result.drained and not result.timed_out
    (lifted,) = result.busy
    assert not lifted.draining and lifted.state is WorkerState.READY
    assert await state_of(client, "aa01") is WorkerState.READY
    daemon.router.release(held)
    again = await daemon.router.acquire(RouteRequest("llama"))  # routable again
    daemon.router.release(again)


async def test_the_blocking_client_drains_too(daemon: Daemon) -> None:
    def drain() -> bool:
        with Client(daemon.settings.listen[0], credentials=Credentials(), timeout=10) as client:
            return client.drain(Target(selector="pool=b"), timeout=10).drained

    assert await asyncio.to_thread(drain)


async def test_a_wait_is_refused_or_ended_with_a_reason(
    daemon: Daemon, client: AsyncClient
) -> None:
    with pytest.raises(InvalidInputError, match="timeout_seconds -1"):
        async for _ in client.wait_drained(Target(worker="aa01"), timeout=-1):
            pass
    with pytest.raises(WorkerNotFoundError):
        await client.drain(Target(worker="zz"))
    await hold(daemon, "pool=a")
    draining = Draining(client, Target(worker="aa01"))
    await draining.next()
    daemon.stop()  # SIGTERM: open waits end, the drain itself stays in the store
    with pytest.raises(ShuttingDownError, match="the drain goes on"):
        await draining.result()
