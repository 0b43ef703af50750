"""Issue 15.5 through the front: a request waiting for a busy ``capacity/gold`` worker is not
failed when that worker loses the taint, if another worker gains it within the router's
settle window. Real mocker workers in a real etcd; the moves go through the workers' own
taint routes, as an operator's script would make them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest

from dynamod.router import RouterKnobs
from dynamod.store import Store
from tests.front.test_front import MODEL, PROMPT, SLOW, FrontStack, serve_front, workers
from tests.router.test_routing_e2e import etcd, holds, queued, served_by, set_taints_by_route
from tests.support.processes import Proc

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(120)]

__all__ = ["etcd"]  # the fixture, used by name

GOLD = {"required_taints": ["capacity/gold"]}
SPECS = [("--taint", "capacity/gold", "--max-num-seqs", "1", *SLOW), ("--taint", "capacity/silver")]


@asynccontextmanager
async def gold_busy(store: Store, url: str, settle: float) -> AsyncIterator[Stage]:
    """Two workers (gold with one slot, silver), the gold one busy with a long stream."""
    async with (
        serve_front(store, config=RouterKnobs(settle_window=settle)) as s,
        workers(url, *SPECS) as [gold, silver],
    ):
        await s.sees(gold, silver)
        nvext = {"nvext": {"routing_constraints": GOLD}}
        stream = await s.client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=4000, stream=True, extra_body=nvext
        )
        await anext(aiter(stream))
        try:
            yield Stage(s, gold, silver)
        finally:
            await stream.close()


@dataclass(frozen=True)
class Stage:
    s: FrontStack
    gold: Proc
    silver: Proc

    async def move_gold_away(self) -> None:
        """The first half of a move: gold leaves its worker, and the view has seen it."""
        await set_taints_by_route(self.s.http, self.gold, [])
        await self.s.view.wait_for(holds(self.gold))


async def test_a_waiting_request_is_served_by_the_worker_the_taint_moved_to(
    etcd: Store, etcd_url: str
) -> None:
    async with gold_busy(etcd, etcd_url, settle=30) as stage, asyncio.TaskGroup() as group:
        waiting = group.create_task(served_by(stage.s, **GOLD))
        await queued(stage.s, 1)
        await stage.move_gold_away()
        assert stage.s.router.depth(MODEL) == 1 and not waiting.done()
        await set_taints_by_route(stage.s.http, stage.silver, ["capacity/gold", "capacity/silver"])
    assert waiting.result() == stage.silver.field("id")


async def test_without_a_settle_window_the_removal_answers_503_at_once(
    etcd: Store, etcd_url: str
) -> None:
    async with gold_busy(etcd, etcd_url, settle=0) as stage, asyncio.TaskGroup() as group:
        waiting = group.create_task(stage.s.status_error(nvext={"routing_constraints": GOLD}))
        await queued(stage.s, 1)
        await stage.move_gold_away()
    error = waiting.result()
    assert error.status_code == 503
    assert isinstance(error.body, dict) and error.body["code"] == "no_eligible_worker"
    assert stage.s.metric("dynamod_router_decisions_total", model=MODEL, outcome="no_worker") == 1
