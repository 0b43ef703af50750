"""A waiting request is woken by a taint update made through discovery, on every store."""

from __future__ import annotations

import asyncio

import pytest

from dynamod.discovery.records import register, update_taints
from dynamod.discovery.view import WorkerView
from dynamod.router import Router, RouteRequest
from dynamod.store import Store
from dynamod.taints import RoutingConstraints, TaintUpdate
from tests.factories import make_record

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
