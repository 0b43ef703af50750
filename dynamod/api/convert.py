"""Between the daemon's reports (``dynamod/reports.py``) and the wire messages. Both
directions live here, so the server and the client cannot disagree."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable

from dynamod.api.v1 import dynamo_pb2 as pb
from dynamod.load import Load
from dynamod.model import WorkerRecord, canonical_json
from dynamod.reported import EngineLoad
from dynamod.reports import (
    CandidateInfo,
    ChangeError,
    DaemonState,
    EventInfo,
    EventKind,
    ExplainInfo,
    StatusInfo,
    TaintChange,
    WorkerInfo,
)
from dynamod.taints import UpdateAction

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
}
KIND_NAMES = {number: name for name, number in KINDS.items()}


def worker_to_pb(info: WorkerInfo) -> pb.Worker:
    record = info.record
    return pb.Worker(
        id=record.instance_id,
        key=record.key,
        namespace=record.namespace,
        component=record.component,
        endpoint=record.endpoint,
        model=record.model,
        address=record.address,
        system_address=record.system_address,
        taints=list(record.taints),
        topology=dict(record.runtime_config.topology_domains),
        revision=info.revision,
        mdcsum=info.mdcsum,
        started_at=record.started_at,
        host=record.host,
        pid=record.pid,
        version=record.version,
        load=pb.Load(
            active_requests=info.load.active_requests,
            active_prompt_tokens=info.load.prefill_tokens,
            active_kv_blocks=info.load.kv_blocks,
        ),
        record_json=canonical_json(record.to_json()).decode(),
        engine=None if info.engine is None else pb.EngineLoad(**info.engine.to_json()),
    )


def worker_from_pb(message: pb.Worker) -> WorkerInfo:
    record = WorkerRecord.from_json(json.loads(message.record_json))
    load = Load(
        active_requests=message.load.active_requests,
        prefill_tokens=message.load.active_prompt_tokens,
        kv_blocks=message.load.active_kv_blocks,
    )
    engine = None
    if message.HasField("engine"):
        fields = EngineLoad.__dataclass_fields__
        engine = EngineLoad(**{name: getattr(message.engine, name) for name in fields})
    return WorkerInfo(record, message.revision, load, engine)


def change_to_pb(change: TaintChange) -> pb.TaintChange:
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
        message.error.CopyFrom(pb.Status(code=change.error.code, message=change.error.message))
    return message


def change_from_pb(message: pb.TaintChange) -> TaintChange:
    error = (
        ChangeError(message.error.code, message.error.message)
        if message.HasField("error")
        else None
    )
    return TaintChange(
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
    return message


def event_from_pb(message: pb.Event) -> EventInfo:
    return EventInfo(
        kind=KIND_NAMES[message.kind],
        revision=message.revision,
        time=message.time,
        worker=worker_from_pb(message.worker) if message.HasField("worker") else None,
        added=tuple(message.added),
        removed=tuple(message.removed),
        workers=tuple(worker_from_pb(w) for w in message.workers),
    )


def explain_to_pb(info: ExplainInfo) -> pb.ExplainResponse:
    return pb.ExplainResponse(
        candidates=[_candidate_to_pb(c) for c in info.candidates],
        chosen=info.chosen,
        summary=info.summary,
    )


# A candidate's fields besides its worker carry the same names on both sides.
_CANDIDATE_TERMS = tuple(f.name for f in dataclasses.fields(CandidateInfo) if f.name != "worker")


def _candidate_to_pb(c: CandidateInfo) -> pb.Candidate:
    terms = {name: getattr(c, name) for name in _CANDIDATE_TERMS}
    return pb.Candidate(worker=worker_to_pb(c.worker), **terms)


def explain_from_pb(message: pb.ExplainResponse) -> ExplainInfo:
    return ExplainInfo(
        candidates=tuple(_candidate_from_pb(c) for c in message.candidates),
        chosen=message.chosen,
        summary=message.summary,
    )


def _candidate_from_pb(c: pb.Candidate) -> CandidateInfo:
    terms = {name: getattr(c, name) for name in _CANDIDATE_TERMS}
    return CandidateInfo(worker=worker_from_pb(c.worker), **terms)


def status_to_pb(info: StatusInfo) -> pb.StatusResponse:
    return pb.StatusResponse(**{**info.__dict__, "state": str(info.state)})


def status_from_pb(message: pb.StatusResponse) -> StatusInfo:
    values = {f.name: getattr(message, f.name) for f in dataclasses.fields(StatusInfo)}
    return StatusInfo(**{**values, "state": DaemonState(message.state)})


def workers_from_pb(messages: Iterable[pb.Worker]) -> list[WorkerInfo]:
    return [worker_from_pb(m) for m in messages]
