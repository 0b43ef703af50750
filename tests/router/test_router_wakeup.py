"""A waiting request is woken by a taint update made through discovery, on every store,
and survives a remove-then-add move of its taint within the settle window."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from dynamod.discovery.registration import register
from dynamod.discovery.updates import update_taints
from dynamod.discovery.view import WorkerView
from dynamod.errors import NoEligibleWorkerError, RoutingError
from dynamod.router import Assignment, Router, RouteRequest, RouterKnobs
from dynamod.store import Store
from dynamod.taints import RoutingConstraints, TaintUpdate
from tests.support.factories import make_record

pytestmark = pytest.mark.timeout(60)

FAST = RoutingConstraints(required_taints=frozenset({"capacity/fast"}))


async def test_taint_update_dispatches_the_waiting_request(store: Store) -> None:
    """Two workers of capacity 1, tainted capacity/fast and capacity/slow. The second
    request needing capacity/fast waits; adding capacity/fast to the other worker through
    update_taints dispatches it there. Nothing in the router sleeps or polls: the queue's
    own record says how long the request waited."""
    fast = make_record(instance_id="f0", taints=["capacity/fast"], max_num_seqs=1)
    slow = make_record(instance_id="s0", taints=["capacity/slow"], max_num_seqs=1)
    for record in (fast, slow):
        await register(store, record, await store.grant(30))
    router = Router()
    view = WorkerView(store)
    view.listen(router.apply)
    async with asyncio.TaskGroup() as group:
        watcher = group.create_task(view.run())
        await view.wait_for(lambda v: len(v) == 2)
        first = await router.acquire(RouteRequest("llama", FAST))
        assert first.worker.instance_id == "f0"
        second = group.create_task(router.acquire(RouteRequest("llama", FAST, max_wait=30)))
        await asyncio.sleep(0)  # one turn of the loop: the task runs until it parks
        assert router.queue_depth == 1
        await update_taints(store, slow.key, TaintUpdate.add(["capacity/fast"]))
        async with asyncio.timeout(10):
            assignment = await second
        assert assignment.worker.instance_id == "s0"
        assert assignment.waited > 0
        assert router.queue_depth == 0
        router.release(first)
        router.release(assignment)
        watcher.cancel()


GOLD = RoutingConstraints(required_taints=frozenset({"capacity/gold"}))


@asynccontextmanager
async def routed_view(
    store: Store, config: RouterKnobs
) -> AsyncIterator[tuple[Router, WorkerView]]:
    """A router fed by a view of ``store``, as the daemon wires them."""
    router = Router(config)
    view = WorkerView(store)
    view.listen(router.apply)
    async with asyncio.TaskGroup() as group:
        watcher = group.create_task(view.run())
        try:
            yield router, view
        finally:
            watcher.cancel()


def holds(key: str, taint: str, present: bool) -> Callable[[WorkerView], bool]:
    def check(view: WorkerView) -> bool:
        record = view.get(key)
        return record is not None and (taint in record.taints) == present

    return check


async def test_a_waiting_request_survives_its_taint_moving_to_another_worker(store: Store) -> None:
    """Issue 15.5: the busy gold worker loses the taint through the discovery update, and
    only then does another worker gain it. The request waiting for gold is not failed at
    the removal: it waits out the settle window and is dispatched to the new holder."""
    gold = make_record(instance_id="g0", taints=["capacity/gold"], max_num_seqs=1)
    silver = make_record(instance_id="s0", taints=["capacity/silver"], max_num_seqs=1)
    for record in (gold, silver):
        await register(store, record, await store.grant(30))
    async with routed_view(store, RouterKnobs(settle_window=30)) as (router, view):
        await view.wait_for(lambda v: len(v) == 2)
        first = await router.acquire(RouteRequest("llama", GOLD))
        async with asyncio.TaskGroup() as group:
            second = group.create_task(router.acquire(RouteRequest("llama", GOLD)))
            await asyncio.sleep(0)  # one turn of the loop: the task runs until it parks
            assert router.queue_depth == 1
            await update_taints(store, gold.key, TaintUpdate.remove(["capacity/gold"]))
            await view.wait_for(holds(gold.key, "capacity/gold", present=False))
            assert router.queue_depth == 1 and not second.done()
            await update_taints(store, silver.key, TaintUpdate.add(["capacity/gold"]))
            async with asyncio.timeout(10):
                assignment = await second
        assert assignment.worker.instance_id == "s0"
        router.release(first)
        router.release(assignment)


async def test_without_a_settle_window_the_removal_fails_the_waiting_request(
    store: Store,
) -> None:
    gold = make_record(instance_id="g0", taints=["capacity/gold"], max_num_seqs=1)
    await register(store, gold, await store.grant(30))
    async with routed_view(store, RouterKnobs(settle_window=0)) as (router, view):
        await view.wait_for(lambda v: len(v) == 1)
        first = await router.acquire(RouteRequest("llama", GOLD))
        async with asyncio.TaskGroup() as group:
            second = group.create_task(_attempt(router, RouteRequest("llama", GOLD)))
            await asyncio.sleep(0)
            await update_taints(store, gold.key, TaintUpdate.remove(["capacity/gold"]))
            async with asyncio.timeout(10):
                error = await second
        assert isinstance(error, NoEligibleWorkerError)
        assert "no worker of model 'llama' has capacity/gold" in str(error)
        router.release(first)


async def _attempt(router: Router, request: RouteRequest) -> Assignment | RoutingError:
    try:
        return await router.acquire(request)
    except RoutingError as exc:
        return exc
