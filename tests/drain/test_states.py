"""A worker's state, its precedence, what the router makes of the drain taint, and the
state and drain figures on the wire: pure, no processes."""

from __future__ import annotations

import pytest

from dynamod.api import convert, worker_pages
from dynamod.api.v1 import dynamo_pb2 as pb
from dynamod.discovery_events import WorkerAdded
from dynamod.engine_events import EngineLoad
from dynamod.errors import NoEligibleWorkerError, PermissionDeniedError
from dynamod.load import IDLE, Load
from dynamod.records import WorkerRecord
from dynamod.reports import DrainEvent, DrainResult, DrainStatus
from dynamod.results import (
    InFlight,
    UpdateFailure,
    UpdateOutcome,
    WorkerInfo,
    WorkerState,
    worker_state,
)
from dynamod.router import Router, RouteRequest
from dynamod.taints import (
    CORDONED,
    DRAIN_TAINTS,
    DRAINING,
    OPERATOR_TAINTS,
    RoutingConstraints,
    TaintUpdate,
)
from tests.support.factories import make_record

BUSY = Load(1, 10, 1)
RUNNING = EngineLoad(running=1)
WAITING = EngineLoad(waiting=2)
IDLE_ENGINE = EngineLoad()
SICK = EngineLoad(running=1, healthy=False, reason="upstream is not answering")


@pytest.mark.parametrize(
    ("taints", "load", "engine", "state"),
    [
        ((), IDLE, None, WorkerState.READY),
        (("pool=a",), BUSY, RUNNING, WorkerState.READY),
        ((CORDONED,), BUSY, RUNNING, WorkerState.CORDONED),
        (DRAIN_TAINTS, IDLE, None, WorkerState.DRAINED),
        (DRAIN_TAINTS, IDLE, IDLE_ENGINE, WorkerState.DRAINED),
        (DRAIN_TAINTS, BUSY, None, WorkerState.DRAINING),
        (DRAIN_TAINTS, IDLE, RUNNING, WorkerState.DRAINING),  # another daemon's request
        (DRAIN_TAINTS, IDLE, WAITING, WorkerState.DRAINING),
        ((DRAINING,), IDLE, None, WorkerState.DRAINED),  # the drain taint alone still counts
        (DRAIN_TAINTS, BUSY, SICK, WorkerState.UNHEALTHY),  # unhealthy comes first
        ((CORDONED,), IDLE, SICK, WorkerState.UNHEALTHY),
        ((), IDLE, SICK, WorkerState.UNHEALTHY),
    ],
)
def test_the_state_follows_its_documented_precedence(
    taints: tuple[str, ...], load: Load, engine: EngineLoad | None, state: WorkerState
) -> None:
    assert worker_state(taints, load, engine) is state
    assert state.routable is (state is WorkerState.READY)


def test_in_flight_counts_the_router_and_the_engine_where_it_reports() -> None:
    assert InFlight.of(BUSY, None) == InFlight(1)
    assert InFlight.of(IDLE, WAITING) == InFlight(0, 0, 2)
    assert InFlight(0).idle and InFlight(0, 0, 0).idle
    assert not InFlight(0, 1, 0).idle and not InFlight(1).idle
    assert InFlight(1, 1, 0).describe() == "router 1, engine running 1, waiting 0"
    assert InFlight(0).describe() == "router 0, engine not reporting"


def test_worker_info_derives_its_state_unless_given_one() -> None:
    record = make_record(taints=DRAIN_TAINTS)
    assert WorkerInfo(record, 1).state is WorkerState.DRAINED
    assert WorkerInfo(record, 1, BUSY).state is WorkerState.DRAINING
    given = WorkerInfo(record, 1, state=WorkerState.DRAINING)
    assert given.state is WorkerState.DRAINING


def test_the_drain_taint_is_the_operators_as_the_cordon_is() -> None:
    assert DRAINING in OPERATOR_TAINTS and CORDONED in OPERATOR_TAINTS
    held = (CORDONED, DRAINING, "pool=a")
    # A worker's own replace keeps both; adding or removing one there is refused.
    assert TaintUpdate.replace([]).keeping(OPERATOR_TAINTS).apply(held) == (CORDONED, DRAINING)
    with pytest.raises(PermissionDeniedError, match=r"'dynamo\.io/draining' is the operator's"):
        TaintUpdate.remove([DRAINING]).keeping(OPERATOR_TAINTS).apply(held)
    with pytest.raises(PermissionDeniedError, match=r"'dynamo\.io/draining' is the operator's"):
        TaintUpdate.add([DRAINING]).keeping(OPERATOR_TAINTS).apply(("pool=a",))


def _router_with(*records: WorkerRecord) -> Router:
    router = Router()
    for revision, record in enumerate(records, 1):
        router.apply(WorkerAdded(record, revision))
    return router


async def test_the_router_sends_a_drained_worker_only_what_requires_both_taints() -> None:
    drained = make_record(taints=DRAIN_TAINTS)
    router = _router_with(drained)
    with pytest.raises(NoEligibleWorkerError, match="cordoned"):
        await router.acquire(RouteRequest("llama", max_wait=0))
    # Requiring the cordon alone reached a cordoned worker before; a drained one needs both.
    cordon_only = RouteRequest("llama", _requires(CORDONED), max_wait=0)
    with pytest.raises(NoEligibleWorkerError, match="cordoned"):
        await router.acquire(cordon_only)
    both = await router.acquire(RouteRequest("llama", _requires(*DRAIN_TAINTS), max_wait=0))
    assert both.worker.key == drained.key
    (row,) = router.explain(RouteRequest("llama")).workers
    assert row.ineligible is not None and row.ineligible.cordoned


async def test_a_lone_drain_taint_keeps_the_worker_out_of_routing() -> None:
    router = _router_with(make_record(taints=(DRAINING,)))
    with pytest.raises(NoEligibleWorkerError, match="cordoned"):
        await router.acquire(RouteRequest("llama", max_wait=0))


def _requires(*taints: str) -> RoutingConstraints:
    return RoutingConstraints(required_taints=frozenset(taints))


async def test_router_watchers_hear_every_load_and_report_change() -> None:
    record = make_record()
    router = _router_with(record)
    heard: list[str] = []
    stop = router.watch(heard.append)
    assignment = await router.acquire(RouteRequest("llama", prompt_tokens=4))
    router.prefill_done(assignment)
    router.release(assignment)
    router.report(record.key, RUNNING)
    assert heard == [record.key] * 4
    stop()
    router.report(record.key, None)
    assert len(heard) == 4


def _listing(info: WorkerInfo, fields: frozenset[str]) -> pb.Worker:
    messages = worker_pages.WorkerMessages(lambda _: info.record)
    encoded = messages.response([info], fields, 1, 8)
    (worker,) = pb.ListWorkersResponse.FromString(encoded).workers
    return worker


@pytest.mark.parametrize(
    "fields", [worker_pages.DEFAULT_FIELDS, frozenset({"id", "state"}), frozenset({"state"})]
)
def test_a_listing_sends_the_state_the_load_and_the_report_make(fields: frozenset[str]) -> None:
    record = make_record(taints=DRAIN_TAINTS)
    for load, engine, state in [
        (IDLE, None, "drained"),
        (BUSY, None, "draining"),
        (IDLE, RUNNING, "draining"),
        (IDLE, IDLE_ENGINE, "drained"),
        (BUSY, SICK, "unhealthy"),
    ]:
        info = WorkerInfo(record, 3, load, engine)
        assert _listing(info, fields).state == state
        assert convert.worker_to_pb(info).state == state
        assert convert.worker_from_pb(_listing(info, fields)).state is WorkerState(state)


def test_a_worker_from_a_daemon_without_state_derives_it() -> None:
    message = convert.worker_to_pb(WorkerInfo(make_record(taints=(CORDONED,)), 1))
    message.state = ""
    assert convert.worker_from_pb(message).state is WorkerState.CORDONED
    message.state = "hibernating"  # a newer daemon's: derived here instead
    assert convert.worker_from_pb(message).state is WorkerState.CORDONED


def test_drain_events_cross_the_wire_whole() -> None:
    statuses = (
        DrainStatus("a1", "k/a1", WorkerState.DRAINING, InFlight(1, 1, 0)),
        DrainStatus("b2", "k/b2", WorkerState.DRAINED, InFlight(0), gone=True),
        DrainStatus("c3", "k/c3", WorkerState.READY, InFlight(0, 0, 0), draining=False),
    )
    event = DrainEvent(statuses, last=True, drained=False, timed_out=True)
    assert convert.drain_event_from_pb(convert.drain_event_to_pb(event)) == event


def test_a_status_says_whether_the_wait_for_it_is_over() -> None:
    busy = DrainStatus("a1", "k", WorkerState.DRAINING, InFlight(1))
    assert not busy.drained and not busy.over
    assert busy.describe() == "draining: router 1, engine not reporting"
    gone_busy = DrainStatus("a1", "k", WorkerState.DRAINING, InFlight(1), gone=True)
    assert gone_busy.over and not gone_busy.drained
    assert gone_busy.describe() == (
        "gone mid-drain (killed or left) with router 1, engine not reporting in flight"
    )
    gone_idle = DrainStatus("a1", "k", WorkerState.DRAINING, InFlight(0), gone=True)
    assert gone_idle.over and not gone_idle.drained
    lifted = DrainStatus("a1", "k", WorkerState.READY, InFlight(1, 1, 0), draining=False)
    assert lifted.over and not lifted.drained
    assert lifted.describe() == "ready: not draining (uncordoned, or never drained)"


def test_a_drain_result_is_drained_only_when_every_cordon_held_and_every_worker_drained() -> None:
    done = DrainStatus("a1", "k/a1", WorkerState.DRAINED, InFlight(0))
    ok = UpdateOutcome("a1", "k/a1", (), DRAIN_TAINTS, 4)
    last = DrainEvent((done,), last=True, drained=True)
    assert DrainResult.of([ok], {"k/a1": done}, last).drained
    failed = UpdateOutcome("b2", "k/b2", (), (), 0, UpdateFailure("ABORTED", "lost"))
    result = DrainResult.of([ok, failed], {"k/a1": done}, last)
    assert not result.drained and result.busy == ()
    assert not DrainResult.of([ok], {"k/a1": done}, None).drained
