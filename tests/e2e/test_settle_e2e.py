"""Issue 15.5 through the front: a request waiting for a busy ``capacity/gold`` worker is not
failed when that worker loses the taint, if another worker gains it within the router's
settle window. Real mocker workers in a real etcd; the moves go through the workers' own
taint routes, as an operator's script would make them."""

from __future__ import annotations

import asyncio

import openai
import pytest

from dynamod.router import RouterConfig
from dynamod.store import Store
from tests.e2e.test_routing_e2e import etcd, holds, queued, served_by, set_taints_by_route
from tests.integration.test_front import MODEL, PROMPT, SLOW, FrontStack, serve_front, workers
from tests.procs import Proc

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(120)]

__all__ = ["etcd"]  # the fixture, used by name

GOLD = {"required_taints": ["capacity/gold"]}
SPECS = [("--taint", "capacity/gold", "--max-num-seqs", "1", *SLOW), ("--taint", "capacity/silver")]


async def occupy(s: FrontStack) -> openai.AsyncStream[openai.types.Completion]:
    """A long stream on the gold worker: with one slot, it is busy until the stream ends."""
    nvext = {"nvext": {"routing_constraints": GOLD}}
    stream = await s.client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=4000, stream=True, extra_body=nvext
    )
    await anext(aiter(stream))
    return stream


async def move_gold(s: FrontStack, source: Proc) -> None:
    """The first half of a move: gold leaves its worker, and the view has seen it."""
    await set_taints_by_route(s.http, source, [])
    await s.view.wait_for(holds(source))


async def test_a_waiting_request_is_served_by_the_worker_the_taint_moved_to(
    etcd: Store, etcd_url: str
) -> None:
    async with (
        serve_front(etcd, config=RouterConfig(settle_window=30)) as s,
        workers(etcd_url, *SPECS) as [gold, silver],
    ):
        await s.sees(gold, silver)
        stream = await occupy(s)
        async with asyncio.TaskGroup() as group:
            waiting = group.create_task(served_by(s, **GOLD))
            await queued(s, 1)
            await move_gold(s, gold)
            assert s.router.depth(MODEL) == 1 and not waiting.done()
            await set_taints_by_route(s.http, silver, ["capacity/gold", "capacity/silver"])
        assert waiting.result() == silver.field("id")
        await stream.close()


async def test_without_a_settle_window_the_removal_answers_503_at_once(
    etcd: Store, etcd_url: str
) -> None:
    async with (
        serve_front(etcd, config=RouterConfig(settle_window=0)) as s,
        workers(etcd_url, *SPECS) as [gold, silver],
    ):
        await s.sees(gold, silver)
        stream = await occupy(s)
        async with asyncio.TaskGroup() as group:
            waiting = group.create_task(s.status_error(nvext={"routing_constraints": GOLD}))
            await queued(s, 1)
            await move_gold(s, gold)
        error = waiting.result()
        assert error.status_code == 503
        assert isinstance(error.body, dict) and error.body["code"] == "no_eligible_worker"
        assert s.metric("dynamod_router_decisions_total", model=MODEL, outcome="no_worker") == 1
        await stream.close()
