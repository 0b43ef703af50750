"""Between the daemon's reports (``dynamod/results.py``, ``dynamod/reports.py``) and the wire
messages. Both directions live here, so the server and the client cannot disagree. The
classes of ``reports`` are imported by the calls that build them: a listing or a taint
update never pays for them."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from dynamod import jsoncodec
from dynamod.api.v1 import dynamo_pb2 as pb
from dynamod.engine_events import EngineLoad
from dynamod.errors import InvalidInputError
from dynamod.load import IDLE, Load
from dynamod.records import ModelCard, RuntimeConfig, WorkerRecord, mdcsum
from dynamod.results import (
    InFlight,
    UpdateFailure,
    UpdateOutcome,
    WorkerInfo,
    WorkerState,
    own_key,
    record_state,
)
from dynamod.taints import UpdateAction

if TYPE_CHECKING:
    from dynamod.pool_results import PoolEventInfo
    from dynamod.reports import (
        CandidateInfo,
        DrainEvent,
        DrainStatus,
        EventInfo,
        EventKind,
        ExplainInfo,
        StatusInfo,
    )
    from dynamod.taints import TaintUpdate
    from dynamod.targets import Target

ACTIONS: dict[UpdateAction, pb.TaintAction.ValueType] = {
    "replace": pb.TAINT_ACTION_REPLACE,
    "add": pb.TAINT_ACTION_ADD,
    "remove": pb.TAINT_ACTION_REMOVE,
    "clear": pb.TAINT_ACTION_CLEAR,
}
ACTION_NAMES = {number: name for name, number in ACTIONS.items()}

KINDS: dict[EventKind, int] = {
    "ADDED": pb.Event.ADDED,
    "TAINTS": pb.Event.TAINTS,
    "REMOVED": pb.Event.REMOVED,
    "RESYNC": pb.Event.RESYNC,
    "POOL": pb.Event.POOL,
}
KIND_NAMES = {number: name for name, number in KINDS.items()}


# How each field's value comes from a record and its revision; load is set per call.
_VALUES: dict[str, Callable[[WorkerRecord, int], object]] = {
    "id": lambda r, _: r.instance_id,
    "key": lambda r, _: own_key(r),
    "namespace": lambda r, _: r.namespace,
    "component": lambda r, _: r.component,
    "endpoint": lambda r, _: r.endpoint,
    "model": lambda r, _: r.model,
    "address": lambda r, _: r.address,
    "system_address": lambda r, _: r.system_address,
    "taints": lambda r, _: list(r.taints),
    "topology": lambda r, _: dict(r.runtime_config.topology_domains),
    "revision": lambda _, revision: revision,
    "mdcsum": lambda r, _: mdcsum(r.model_card),
    "started_at": lambda r, _: r.started_at,
    "host": lambda r, _: r.host,
    "pid": lambda r, _: r.pid,
    "version": lambda r, _: r.version,
    "record_json": lambda r, _: jsoncodec.canonical(r.to_json()).decode(),
    "model_card_json": lambda r, _: jsoncodec.canonical(r.model_card.to_json()).decode(),
    # What the record alone says (idle, no engine report); a listing sends the state with
    # the load and the report after it when they change it (``worker_pages``).
    "state": lambda r, _: str(record_state(r, IDLE, None)),
    "state_reason": lambda r, _: "",
}


PER_CALL = frozenset({"load", "engine", "state_reason"})
"""Fields that change without the record changing: set on each answer, never kept."""


def worker_message(record: WorkerRecord, revision: int, fields: Iterable[str]) -> pb.Worker:
    """The worker's message with ``fields`` (``Worker`` field names) set, except the ones
    that change without the record (``PER_CALL``)."""
    values = {name: _VALUES[name](record, revision) for name in fields if name not in PER_CALL}
    return pb.Worker(**values)  # type: ignore[arg-type]


def load_to_pb(load: Load) -> pb.Load:
    return pb.Load(
        active_requests=load.active_requests,
        active_prompt_tokens=load.prefill_tokens,
        active_kv_blocks=load.kv_blocks,
    )


def engine_to_pb(engine: EngineLoad) -> pb.EngineLoad:
    return pb.EngineLoad(**engine.to_json())


def worker_to_pb(info: WorkerInfo) -> pb.Worker:
    """The whole message of one worker, load and the engine's report included."""
    message = worker_message(info.record, info.revision, _VALUES)
    message.load.CopyFrom(load_to_pb(info.load))
    if info.engine is not None:
        message.engine.CopyFrom(engine_to_pb(info.engine))
    message.state = str(info.state)
    message.state_reason = info.state_reason
    return message


def worker_from_pb(message: pb.Worker, cards: dict[str, ModelCard] | None = None) -> WorkerInfo:
    """A worker as listed. With ``record_json``, its record exactly as stored; without
    (a listing that asked for fewer fields), a record made of the fields that came, the
    rest at their defaults. ``cards`` remembers decoded model cards across a listing, so
    the workers that share one decode it once."""
    load = Load(
        active_requests=message.load.active_requests,
        prefill_tokens=message.load.active_prompt_tokens,
        kv_blocks=message.load.active_kv_blocks,
    )
    if message.record_json:
        record = WorkerRecord.from_json(jsoncodec.read(message.record_json, "a worker record"))
    else:
        record = _record_of(message, {} if cards is None else cards)
    engine = None
    if message.HasField("engine"):
        fields = EngineLoad.__dataclass_fields__
        engine = EngineLoad(**{name: getattr(message.engine, name) for name in fields})
    state = state_from_pb(message.state)
    reason = message.state_reason
    return WorkerInfo(record, message.revision, load, engine, state, message.key, reason)


def state_from_pb(text: str) -> WorkerState | None:
    """The state a daemon sent; None (derive it here) when it sent none, or one this
    client does not know (a newer daemon's)."""
    try:
        return WorkerState(text) if text else None
    except ValueError:
        return None


def _record_of(message: pb.Worker, cards: dict[str, ModelCard]) -> WorkerRecord:
    text = message.model_card_json
    card = cards.get(text) if text else None
    if card is None:
        card = (
            ModelCard.from_json(jsoncodec.read(text, "a model card"))
            if text
            else ModelCard(name=message.model)
        )
        if text:
            cards[text] = card
    return WorkerRecord(
        instance_id=message.id,
        namespace=message.namespace,
        component=message.component,
        endpoint=message.endpoint,
        address=message.address,
        model_card=card,
        runtime_config=RuntimeConfig(
            taints=tuple(message.taints), topology_domains=dict(message.topology)
        ),
        system_address=message.system_address,
        started_at=message.started_at,
        host=message.host,
        pid=message.pid,
        version=message.version,
    )


def change_to_pb(change: UpdateOutcome) -> pb.TaintChange:
    message = pb.TaintChange(
        worker=change.worker,
        key=change.key,
        before=list(change.before),
        after=list(change.after),
        added=list(change.added),
        removed=list(change.removed),
        revision=change.revision,
        changed=change.changed,
    )
    if change.error is not None:
        message.error.CopyFrom(failure_to_pb(change.error))
    return message


def failure_to_pb(failure: UpdateFailure) -> pb.Status:
    fields = jsoncodec.write(dict(failure.fields)).decode()
    return pb.Status(
        code=failure.code, message=failure.message, error=failure.lineage, fields=fields
    )


def failure_from_pb(message: pb.Status) -> UpdateFailure:
    try:
        fields = jsoncodec.read(message.fields, "the error's fields") if message.fields else {}
    except InvalidInputError:
        fields = {}
    kept = fields if isinstance(fields, dict) else {}
    return UpdateFailure(message.code, message.message, message.error, kept)


def change_from_pb(message: pb.TaintChange) -> UpdateOutcome:
    error = failure_from_pb(message.error) if message.HasField("error") else None
    return UpdateOutcome(
        worker=message.worker,
        key=message.key,
        before=tuple(message.before),
        after=tuple(message.after),
        revision=message.revision,
        error=error,
    )


def event_to_pb(event: EventInfo) -> pb.Event:
    message = pb.Event(
        kind=KINDS[event.kind],  # type: ignore[arg-type]
        revision=event.revision,
        time=event.time,
        added=list(event.added),
        removed=list(event.removed),
        workers=[worker_to_pb(w) for w in event.workers],
    )
    if event.worker is not None:
        message.worker.CopyFrom(worker_to_pb(event.worker))
    if event.pool is not None:
        from dynamod.api.pool_convert import pool_event_to_pb  # pools' types: when needed

        message.pool.CopyFrom(pool_event_to_pb(event.pool))
    return message


def event_from_pb(message: pb.Event) -> EventInfo:
    from dynamod.reports import EventInfo

    return EventInfo(
        kind=KIND_NAMES[message.kind],
        revision=message.revision,
        time=message.time,
        worker=worker_from_pb(message.worker) if message.HasField("worker") else None,
        added=tuple(message.added),
        removed=tuple(message.removed),
        workers=tuple(worker_from_pb(w) for w in message.workers),
        pool=_pool_event(message),
    )


def _pool_event(message: pb.Event) -> PoolEventInfo | None:
    """The pool part of an event; pools' types are imported only for one."""
    if not message.HasField("pool"):
        return None
    from dynamod.api.pool_convert import pool_event_from_pb

    return pool_event_from_pb(message.pool)


def explain_to_pb(info: ExplainInfo) -> pb.ExplainResponse:
    return pb.ExplainResponse(
        candidates=[_candidate_to_pb(c) for c in info.candidates],
        chosen=info.chosen,
        summary=info.summary,
    )


@functools.cache
def _candidate_terms() -> tuple[str, ...]:
    """A candidate's fields besides its worker: they carry the same names on both sides."""
    from dynamod.reports import CandidateInfo

    return tuple(f.name for f in dataclasses.fields(CandidateInfo) if f.name != "worker")


def _candidate_to_pb(c: CandidateInfo) -> pb.Candidate:
    terms = {name: getattr(c, name) for name in _candidate_terms()}
    return pb.Candidate(worker=worker_to_pb(c.worker), **terms)


def explain_from_pb(message: pb.ExplainResponse) -> ExplainInfo:
    from dynamod.reports import ExplainInfo

    return ExplainInfo(
        candidates=tuple(_candidate_from_pb(c) for c in message.candidates),
        chosen=message.chosen,
        summary=message.summary,
    )


def _candidate_from_pb(c: pb.Candidate) -> CandidateInfo:
    from dynamod.reports import CandidateInfo

    terms = {name: getattr(c, name) for name in _candidate_terms()}
    return CandidateInfo(worker=worker_from_pb(c.worker), **terms)


def status_to_pb(info: StatusInfo) -> pb.StatusResponse:
    return pb.StatusResponse(**{**info.__dict__, "state": str(info.state)})


def status_from_pb(message: pb.StatusResponse) -> StatusInfo:
    from dynamod.reports import DaemonState, StatusInfo

    values = {f.name: getattr(message, f.name) for f in dataclasses.fields(StatusInfo)}
    return StatusInfo(**{**values, "state": DaemonState(message.state)})


def workers_from_pb(messages: Iterable[pb.Worker]) -> list[WorkerInfo]:
    cards: dict[str, ModelCard] = {}
    return [worker_from_pb(m, cards) for m in messages]


def list_request(
    model: str, selector: str, namespace: str, component: str, endpoint: str, fields: Iterable[str]
) -> pb.ListWorkersRequest:
    """A listing's request (``ListWorkers``, ``StreamWorkers``), as a client sends it."""
    return pb.ListWorkersRequest(
        model=model,
        selector=selector,
        namespace=namespace,
        component=component,
        endpoint=endpoint,
        fields=list(fields),
    )


def update_request(update: TaintUpdate, target: Target, dry_run: bool) -> pb.UpdateTaintsRequest:
    """A taint update's request (``UpdateTaints``, ``StreamUpdateTaints``)."""
    request = pb.UpdateTaintsRequest(
        action=ACTIONS[update.action],
        taints=list(update.taints),
        keys=list(update.keys),
        dry_run=dry_run,
    )
    target_to_pb(target, request)
    return request


def target_to_pb(target: Target, request: pb.UpdateTaintsRequest | pb.WaitDrainedRequest) -> None:
    """Put ``target`` in ``request``'s ``target`` oneof (and an update's
    ``expect_revision``)."""
    if target.worker is not None:
        request.worker = target.worker
    elif target.selector is not None:
        request.selector = target.selector
    else:
        request.all = True
    if target.expect_revision is not None and isinstance(request, pb.UpdateTaintsRequest):
        request.expect_revision = target.expect_revision


def target_from_pb(request: pb.UpdateTaintsRequest | pb.WaitDrainedRequest) -> Target:
    """The ``Target`` of ``request``; ``InvalidInputError`` when it names none."""
    from dynamod.targets import Target  # the server's; a client only sends targets

    which = request.WhichOneof("target")
    expect = None
    if isinstance(request, pb.UpdateTaintsRequest) and request.HasField("expect_revision"):
        expect = request.expect_revision
    return Target(
        worker=request.worker if which == "worker" else None,
        selector=request.selector if which == "selector" else None,
        all=which == "all" and request.all,
        expect_revision=expect,
    )


def drain_status_to_pb(status: DrainStatus) -> pb.DrainStatus:
    flight = status.in_flight
    return pb.DrainStatus(
        worker=status.worker,
        key=status.key,
        state=str(status.state),
        requests=flight.requests,
        engine_reports=flight.running is not None,
        running=flight.running or 0,
        waiting=flight.waiting or 0,
        draining=status.draining,
        gone=status.gone,
    )


def drain_status_from_pb(message: pb.DrainStatus) -> DrainStatus:
    from dynamod.reports import DrainStatus

    reports = message.engine_reports
    flight = InFlight(
        message.requests,
        message.running if reports else None,
        message.waiting if reports else None,
    )
    idle = WorkerState.DRAINED if flight.idle else WorkerState.DRAINING
    state = state_from_pb(message.state) or idle
    return DrainStatus(message.worker, message.key, state, flight, message.draining, message.gone)


def drain_event_to_pb(event: DrainEvent) -> pb.WaitDrainedResponse:
    return pb.WaitDrainedResponse(
        workers=[drain_status_to_pb(w) for w in event.workers],
        last=event.last,
        drained=event.drained,
        timed_out=event.timed_out,
    )


def drain_event_from_pb(message: pb.WaitDrainedResponse) -> DrainEvent:
    from dynamod.reports import DrainEvent

    return DrainEvent(
        tuple(drain_status_from_pb(w) for w in message.workers),
        last=message.last,
        drained=message.drained,
        timed_out=message.timed_out,
    )


def wait_drained_to_pb(
    target: Target, timeout: float | None, after_revision: int
) -> pb.WaitDrainedRequest:
    request = pb.WaitDrainedRequest(timeout_seconds=timeout or 0.0, after_revision=after_revision)
    target_to_pb(target, request)
    return request
