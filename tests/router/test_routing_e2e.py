"""Routing end to end: real mocker workers registered in a real etcd, the view, the router
and the front wired as the daemon wires them, and the official ``openai`` client.

A taint change made through a worker's own HTTP route, or through the discovery update,
reaches the router through etcd and moves the very next requests: no restart, no sleep,
only a wait for the view to show the change.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import openai
import pytest

from dynamod.discovery.updates import update_taints
from dynamod.discovery.view import WorkerView
from dynamod.store import Store, open_store
from dynamod.taints import TaintUpdate
from tests.front.test_front import MODEL, FrontStack, serve_front, workers
from tests.support.processes import Proc

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(120)]

FAST = {"required_taints": ["capacity/fast"]}
SLOW = {"required_taints": ["capacity/slow"]}


@pytest.fixture
async def etcd(etcd_url: str) -> AsyncIterator[Store]:
    async with await open_store(etcd_url) as store:
        yield store


async def set_taints_by_route(http: aiohttp.ClientSession, proc: Proc, taints: list[str]) -> None:
    """``POST <system>/engine/update/model_taints``, as an operator's script would."""
    url = proc.field("system") + "/engine/update/model_taints"
    async with http.post(url, json={"taints": taints}) as response:
        assert response.status == 200, await response.text()


def holds(proc: Proc, *taints: str) -> Callable[[WorkerView], bool]:
    """A view predicate: the worker's record holds exactly ``taints`` (sorted)."""
    key = proc.field("key")

    def check(view: WorkerView) -> bool:
        record = view.get(key)
        return record is not None and record.taints == tuple(sorted(taints))

    return check


async def served_by(s: FrontStack, **constraints: Any) -> str:
    worker_id, _ = await s.completion(**constraints)
    return worker_id


async def test_required_and_preferred_taints_route_and_a_change_moves_the_next_requests(
    etcd: Store, etcd_url: str
) -> None:
    specs = [("--taint", "capacity/fast"), ("--taint", "capacity/slow"), ("--topology", "zone=a")]
    async with serve_front(etcd) as s, workers(etcd_url, *specs) as [fast, slow, zoned]:
        await s.sees(fast, slow, zoned)
        zone_a = {"required_taints": ["dynamo.topology/zone=a"]}
        for _ in range(2):
            assert await served_by(s, **FAST) == fast.field("id")
            assert await served_by(s, **SLOW) == slow.field("id")
            assert await served_by(s, **zone_a) == zoned.field("id")
            prefer_slow = {"preferred_taints": {"capacity/slow": 1.0}}
            assert await served_by(s, **prefer_slow) == slow.field("id")

        # The zoned worker gains capacity/fast through its own route, and the first fast
        # worker loses it through the discovery update: fast requests move to the zoned one.
        await set_taints_by_route(s.http, zoned, ["capacity/fast"])
        await update_taints(etcd, fast.field("key"), TaintUpdate.clear())
        await s.view.wait_for(holds(zoned, "capacity/fast", "dynamo.topology/zone=a"))
        await s.view.wait_for(holds(fast))
        for _ in range(3):
            assert await served_by(s, **FAST) == zoned.field("id")

        huge = {"routing_constraints": {"required_taints": ["capacity/huge"]}}
        error = await s.status_error(nvext=huge)
        assert error.status_code == 503
        assert isinstance(error.body, dict)
        assert error.body["message"].startswith(
            "no worker of model 'llama' has capacity/huge; 3 workers: "
        )


async def test_dynamo_propagation_scenario(etcd: Store, etcd_url: str) -> None:
    """Worker A is capacity/fast, B capacity/other. A request requiring fast goes to A.
    A's taints become [capacity/slow] through its route; then slow goes to A, fast gets
    503, other goes to B."""
    specs = [("--taint", "capacity/fast"), ("--taint", "capacity/other")]
    async with serve_front(etcd) as s, workers(etcd_url, *specs) as [a, b]:
        await s.sees(a, b)
        assert await served_by(s, **FAST) == a.field("id")

        await set_taints_by_route(s.http, a, ["capacity/slow"])
        await s.view.wait_for(holds(a, "capacity/slow"))

        assert await served_by(s, **SLOW) == a.field("id")
        with pytest.raises(openai.APIStatusError) as caught:
            await served_by(s, **FAST)
        assert caught.value.status_code == 503
        assert isinstance(caught.value.body, dict)
        head, _, workers_said = caught.value.body["message"].partition("; 2 workers: ")
        assert head == "no worker of model 'llama' has capacity/fast"
        assert set(workers_said.split(", ")) == {
            f"{a.field('id')} has capacity/slow (missing capacity/fast)",
            f"{b.field('id')} has capacity/other (missing capacity/fast)",
        }
        assert await served_by(s, required_taints=["capacity/other"]) == b.field("id")


async def queued(s: FrontStack, depth: int) -> None:
    """Wait until ``depth`` requests wait in the router's queue (its queue signal)."""
    reached = asyncio.Event()

    def seen(model: str, now: int) -> None:
        if model == MODEL and now == depth:
            reached.set()

    stop = s.router.watch_queue(seen)
    try:
        if s.router.depth(MODEL) != depth:
            async with asyncio.timeout(10):
                await reached.wait()
    finally:
        stop()


async def test_a_request_waiting_for_a_taint_is_dispatched_when_a_worker_gains_it(
    etcd: Store, etcd_url: str
) -> None:
    async with serve_front(etcd) as s, workers(etcd_url, ("--taint", "capacity/slow")) as [w]:
        await s.sees(w)
        async with asyncio.TaskGroup() as group:
            waiting = group.create_task(s.completion(required_taints=["gpu=h100"], max_wait=60))
            await queued(s, 1)
            await set_taints_by_route(s.http, w, ["capacity/slow", "gpu=h100"])
        assert waiting.result()[0] == w.field("id")
        assert s.router.depth(MODEL) == 0
        assert s.metric("dynamod_router_decisions_total", model=MODEL, outcome="dispatched") == 1
