"""What engines report: the value, its wire form, and the router's busy policy for it
(a worker whose engine reports waiting requests, or ill health, takes no new request;
the report that frees it dispatches the requests that waited)."""

from __future__ import annotations

import asyncio

import pytest

from dynamod.discovery_events import WorkerAdded
from dynamod.engine_events import RECORD_FIELD, EngineLoad, offer, offered_path
from dynamod.errors import InvalidInputError, QueueTimeoutError
from dynamod.load import Busy
from dynamod.router import RouteRequest
from dynamod.router.saturation import busy
from tests.router.test_router_queue import attempt, park, router_with
from tests.support.factories import make_record

pytestmark = pytest.mark.timeout(30)


def test_engine_load_round_trips_and_refuses_wrong_types_by_name() -> None:
    load = EngineLoad(running=3, waiting=1, kv_usage=0.25, healthy=False, reason="down")
    assert EngineLoad.from_json(load.to_json()) == load
    assert EngineLoad.from_json({"running": 2, "kv_usage": 1, "future_field": "x"}) == EngineLoad(
        running=2, kv_usage=1.0
    )
    with pytest.raises(InvalidInputError, match="'waiting' must be int, got '2'"):
        EngineLoad.from_json({"waiting": "2"})
    with pytest.raises(InvalidInputError, match="'healthy' must be bool, got 1"):
        EngineLoad.from_json({"healthy": 1})
    with pytest.raises(InvalidInputError, match="must be a JSON object"):
        EngineLoad.from_json([1, 2])


def test_a_record_offers_its_events_stream_only_with_a_system_address() -> None:
    record = make_record()
    assert offered_path(record) is None
    offering = make_record().__class__(
        **{
            **record.__dict__,
            "system_address": "http://127.0.0.1:9",
            "extra": {RECORD_FIELD: offer()},
        }
    )
    assert offered_path(offering) == "/engine/events"
    odd = offering.__class__(**{**offering.__dict__, "extra": {RECORD_FIELD: {"path": "x"}}})
    assert offered_path(odd) is None


def test_busy_policy() -> None:
    assert busy(None) is None
    assert busy(EngineLoad(running=8)) is None
    assert busy(EngineLoad(running=8, waiting=1)) is Busy.ENGINE_QUEUE
    assert busy(EngineLoad(healthy=False, reason="gone")) is Busy.UNHEALTHY


async def test_reported_waiting_holds_requests_until_a_report_frees_the_worker() -> None:
    worker = make_record()
    router = router_with(worker)
    router.report(worker.key, EngineLoad(running=8, waiting=2))
    async with asyncio.TaskGroup() as tg:
        waiting = await park(tg, router, RouteRequest("llama"))
        assert router.queue_depth == 1 and not waiting.done()
        router.report(worker.key, EngineLoad(running=8, waiting=1))  # still busy
        await asyncio.sleep(0)
        assert not waiting.done()
        router.report(worker.key, EngineLoad(running=8, waiting=0))
    assignment = waiting.result()
    assert not isinstance(assignment, Exception) and assignment.worker.key == worker.key


async def test_an_unhealthy_worker_is_skipped_and_named_in_the_error() -> None:
    healthy, sick = make_record(), make_record()
    router = router_with(healthy, sick)
    router.report(sick.key, EngineLoad(healthy=False, reason="upstream is not answering"))
    for _ in range(4):
        assignment = await router.acquire(RouteRequest("llama"))
        assert assignment.worker.key == healthy.key  # released at once: never busy
        router.release(assignment)
    router.report(healthy.key, EngineLoad(waiting=3))
    outcome = await attempt(router, RouteRequest("llama", max_wait=0.05))
    assert isinstance(outcome, QueueTimeoutError)
    assert "is unhealthy: upstream is not answering" in str(outcome)
    assert "has 3 requests waiting in its engine" in str(outcome)
    explained = {row.worker.key: row.busy for row in router.explain(RouteRequest("llama")).workers}
    assert explained == {healthy.key: Busy.ENGINE_QUEUE, sick.key: Busy.UNHEALTHY}
    router.report(sick.key, None)  # its stream broke: nothing known, routable again
    assert (await router.acquire(RouteRequest("llama"))).worker.key == sick.key


def test_reported_loads_are_kept_per_worker() -> None:
    worker = make_record()
    router = router_with(worker)
    router.apply(WorkerAdded(worker, 9))
    assert router.reported(worker.key) is None
    router.report(worker.key, EngineLoad(running=1))
    assert router.reported(worker.key) == EngineLoad(running=1)
