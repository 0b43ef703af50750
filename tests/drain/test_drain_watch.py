"""``DrainWatch`` over a real view of a memory store and a real router, in this process:
each change of the router's count or the engine's report, and of the view, is heard and
sent; the wait ends drained, timed out, ended by an uncordon, or by the daemon's stop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field

import pytest

from dynamod.discovery.updates import update_taints
from dynamod.discovery.view import WorkerView
from dynamod.drain_watch import DrainWatch
from dynamod.engine_events import EngineLoad
from dynamod.errors import ShuttingDownError
from dynamod.records import WorkerRecord
from dynamod.reports import DrainEvent, DrainStatus
from dynamod.results import InFlight, WorkerState
from dynamod.router import Assignment, Router, RouteRequest
from dynamod.store import Store
from dynamod.store.memory import MemoryStore
from dynamod.taints import DRAIN_TAINTS, RoutingConstraints, TaintUpdate
from dynamod.targets import Target
from dynamod.tasks import cancel_and_wait
from tests.daemon.helpers import add_worker

pytestmark = pytest.mark.timeout(30)


@dataclass
class Fleet:
    store: Store
    view: WorkerView
    router: Router
    sent: asyncio.Queue[DrainEvent] = field(default_factory=asyncio.Queue)

    async def send(self, event: DrainEvent) -> None:
        await self.sent.put(event)

    async def next(self) -> DrainEvent:
        async with asyncio.timeout(10):
            return await self.sent.get()

    async def drain(self, record: WorkerRecord) -> int:
        return (await update_taints(self.store, record.key, TaintUpdate.add(DRAIN_TAINTS))).revision

    def watch(self, target: Target, after: int) -> DrainWatch:
        def resolve() -> list[WorkerRecord]:
            if target.worker is not None:
                return [self.view.find(target.worker)]
            return [r for r in self.view.records() if target.matcher.matches(r)]

        return DrainWatch(self.view, self.router, resolve, after_revision=after)

    async def hold(self, record: WorkerRecord, pool: str) -> Assignment:
        """A request in flight on ``record`` (the only worker holding ``pool``)."""
        required = RoutingConstraints(required_taints=frozenset({pool}))
        assignment = await self.router.acquire(RouteRequest("llama", required))
        assert assignment.worker.key == record.key
        return assignment


@contextlib.asynccontextmanager
async def fleet() -> AsyncIterator[Fleet]:
    async with MemoryStore() as store:
        view, router = WorkerView(store), Router()
        view.listen(router.apply)
        watcher = asyncio.create_task(view.run())
        try:
            await asyncio.wait_for(view.ready.wait(), 10)
            yield Fleet(store, view, router)
        finally:
            await cancel_and_wait(watcher)


async def workers(f: Fleet, *pools: str) -> list[WorkerRecord]:
    records = [await add_worker(f.store, taints=(pool,)) for pool in pools]
    await f.view.wait_for(lambda v: all(v.get(r.key) is not None for r in records))
    return records


def running(watch: DrainWatch, f: Fleet, deadline: float | None = None) -> Awaitable[DrainEvent]:
    return asyncio.ensure_future(watch.run(f.send, deadline))


async def test_a_wait_sends_every_worker_then_each_change_until_all_are_drained() -> None:
    async with fleet() as f:
        a, b = await workers(f, "pool=a", "pool=b")
        held = await f.hold(a, "pool=a")
        after = max([await f.drain(a), await f.drain(b)])
        with f.watch(Target(all=True), after) as watch:
            done = running(watch, f)
            first = await f.next()
            assert not first.last
            assert {s.worker: s for s in first.workers} == {
                a.instance_id: DrainStatus(a.instance_id, a.key, WorkerState.DRAINING, InFlight(1)),
                b.instance_id: DrainStatus(b.instance_id, b.key, WorkerState.DRAINED, InFlight(0)),
            }
            f.router.report(a.key, EngineLoad(running=1))  # the engine has it too
            (running_one,) = (await f.next()).workers
            assert running_one.in_flight == InFlight(1, 1, 0)
            f.router.release(held)  # the router's count ends first, the engine's after
            (engine_only,) = (await f.next()).workers
            assert engine_only.in_flight == InFlight(0, 1, 0)
            assert engine_only.state is WorkerState.DRAINING
            f.router.report(a.key, EngineLoad())
            last = await f.next()
            assert last.last and last.drained and not last.timed_out
            (drained,) = last.workers
            assert drained.state is WorkerState.DRAINED and drained.drained
            assert await done == last


async def test_the_timeout_ends_the_wait_with_what_is_still_in_flight() -> None:
    async with fleet() as f:
        (a,) = await workers(f, "pool=a")
        await f.hold(a, "pool=a")
        after = await f.drain(a)
        loop = asyncio.get_running_loop()
        with f.watch(Target(worker=a.instance_id), after) as watch:
            last = await watch.run(f.send, loop.time() + 0.1)
        assert last.last and last.timed_out and not last.drained
        (busy,) = last.workers
        assert busy.in_flight == InFlight(1) and busy.state is WorkerState.DRAINING


async def test_an_uncordon_ends_the_wait_undrained() -> None:
    async with fleet() as f:
        (a,) = await workers(f, "pool=a")
        await f.hold(a, "pool=a")
        after = await f.drain(a)
        with f.watch(Target(selector="pool=a"), after) as watch:
            done = running(watch, f)
            assert not (await f.next()).last
            await update_taints(f.store, a.key, TaintUpdate.remove(DRAIN_TAINTS))
            last = await f.next()
            assert last.last and not last.drained and not last.timed_out
            (lifted,) = last.workers
            assert not lifted.draining and lifted.state is WorkerState.READY
            assert await done == last


async def test_a_worker_that_leaves_mid_drain_is_gone_with_what_was_in_flight() -> None:
    async with fleet() as f:
        (a,) = await workers(f, "pool=a")
        held = await f.hold(a, "pool=a")
        after = await f.drain(a)
        with f.watch(Target(worker=a.key), after) as watch:
            done = running(watch, f)
            assert not (await f.next()).last
            await f.store.delete(a.key)  # stopped before drained: it deregisters first
            last = await f.next()
            assert last.last and not last.drained and not last.timed_out
            (gone,) = last.workers
            assert gone.gone and gone.in_flight == InFlight(1) and not gone.drained
            assert await done == last
        f.router.release(held)


async def test_a_worker_killed_mid_drain_is_gone_before_its_lease_runs_out() -> None:
    """Its engine's stream breaks (``report(key, None)``) and this router's requests there
    are cut; the record stays until the lease runs out. The wait says gone, with the
    figures last seen, not drained."""
    async with fleet() as f:
        (a,) = await workers(f, "pool=a")
        held = await f.hold(a, "pool=a")
        f.router.report(a.key, EngineLoad(running=1))
        after = await f.drain(a)
        with f.watch(Target(worker=a.key), after) as watch:
            done = running(watch, f)
            (first,) = (await f.next()).workers
            assert first.in_flight == InFlight(1, 1, 0) and not first.gone
            f.router.report(a.key, None)  # the engine stream broke: SIGKILL
            f.router.release(held)  # the relayed stream was cut
            last = await f.next()
            assert last.last and not last.drained
            (gone,) = last.workers
            assert gone.gone and gone.in_flight == InFlight(1, 1, 0)
            assert f.view.get(a.key) is not None  # its lease has not run out
            assert await done == last


async def test_the_wait_begins_once_the_view_holds_the_drains_own_update() -> None:
    async with fleet() as f:
        (a,) = await workers(f, "pool=a")
        # No await between the update and the wait: the view may not hold it yet.
        after = await f.drain(a)
        with f.watch(Target(selector="dynamo.io/draining"), after) as watch:
            last = await watch.run(f.send)
        assert last.drained and [s.worker for s in last.workers] == [a.instance_id]


async def test_a_daemon_that_stops_ends_the_wait() -> None:
    async with fleet() as f:
        (a,) = await workers(f, "pool=a")
        await f.hold(a, "pool=a")
        after = await f.drain(a)
        with f.watch(Target(all=True), after) as watch:
            done = running(watch, f)
            assert not (await f.next()).last
            watch.close()
            with pytest.raises(ShuttingDownError, match="the drain goes on"):
                await done
