"""Between the daemon's reports (``dynamod/reports.py``) and the wire messages. Both
directions live here, so the server and the client cannot disagree."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Sequence

from dynamod.api.v1 import dynamo_pb2 as pb
from dynamod.errors import InvalidInputError
from dynamod.load import Load
from dynamod.model import ModelCard, RuntimeConfig, WorkerRecord, canonical_json, mdcsum
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


WORKER_FIELDS = frozenset(pb.Worker.DESCRIPTOR.fields_by_name)
"""The names a listing's ``fields`` may use."""

# Field sets whose messages ``WorkerMessages`` keeps; clients use a handful (a table, JSON,
# completion), so past this many the memory starts over rather than grow.
FIELD_SETS = 8


def worker_fields(names: Iterable[str]) -> frozenset[str]:
    """The Worker fields a listing asks for: every field when none is named. An unknown
    name is refused with the names that exist."""
    chosen = frozenset(names)
    unknown = sorted(chosen - WORKER_FIELDS)
    if unknown:
        raise InvalidInputError(
            f"fields names {unknown[0]!r}, which is not a worker field; the fields are "
            f"{', '.join(sorted(WORKER_FIELDS))}"
        )
    return chosen or WORKER_FIELDS


# How each field's value comes from a record and its revision; load is set per call.
_VALUES: dict[str, Callable[[WorkerRecord, int], object]] = {
    "id": lambda r, _: r.instance_id,
    "key": lambda r, _: r.key,
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
    "record_json": lambda r, _: canonical_json(r.to_json()).decode(),
    "model_card_json": lambda r, _: canonical_json(r.model_card.to_json()).decode(),
}


def _message(record: WorkerRecord, revision: int, fields: frozenset[str]) -> pb.Worker:
    """The worker's message with ``fields`` set, except its load."""
    values = {name: _VALUES[name](record, revision) for name in fields if name != "load"}
    return pb.Worker(**values)  # type: ignore[arg-type]


def _set_load(message: pb.Worker, load: Load) -> None:
    message.load.active_requests = load.active_requests
    message.load.active_prompt_tokens = load.prefill_tokens
    message.load.active_kv_blocks = load.kv_blocks


def worker_to_pb(info: WorkerInfo) -> pb.Worker:
    """The whole message of one worker, load included."""
    message = _message(info.record, info.revision, WORKER_FIELDS)
    _set_load(message, info.load)
    return message


class WorkerMessages:
    """Listings' messages, each built once per record and field set.

    Encoding a record (``record_json``, ``model_card_json``, ``mdcsum``: JSON and a hash)
    is most of what a large listing costs, and a record changes far less often than it is
    listed. A message is kept while its record is the one the view holds (same object, same
    revision); ``current`` (the view's ``get``) lets entries of workers that left go once
    they outnumber the workers listed.
    """

    def __init__(self, current: Callable[[str], WorkerRecord | None]) -> None:
        self._current = current
        self._built: dict[frozenset[str], dict[str, tuple[WorkerRecord, int, pb.Worker]]] = {}

    def response(
        self, infos: Sequence[WorkerInfo], fields: frozenset[str], revision: int, id_prefix: int
    ) -> pb.ListWorkersResponse:
        """One listing message: ``infos`` with ``fields`` (and their loads, when asked)."""
        built = self._messages(fields)
        messages = []
        for info in infos:
            record = info.record
            entry = built.get(record.key)
            if entry is None or entry[0] is not record or entry[1] != info.revision:
                entry = (record, info.revision, _message(record, info.revision, fields))
                built[record.key] = entry
            messages.append(entry[2])
        if len(built) > 2 * len(infos) + 64:
            self._prune(built)
        reply = pb.ListWorkersResponse(workers=messages, revision=revision, id_prefix=id_prefix)
        if "load" in fields:
            for message, info in zip(reply.workers, infos, strict=True):
                if not info.load.idle:
                    _set_load(message, info.load)
        return reply

    def _messages(self, fields: frozenset[str]) -> dict[str, tuple[WorkerRecord, int, pb.Worker]]:
        built = self._built.get(fields)
        if built is None:
            if len(self._built) >= FIELD_SETS:
                self._built.clear()
            built = self._built[fields] = {}
        return built

    def _prune(self, built: dict[str, tuple[WorkerRecord, int, pb.Worker]]) -> None:
        gone = [key for key, entry in built.items() if self._current(key) is not entry[0]]
        for key in gone:
            del built[key]


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
        record = WorkerRecord.from_json(json.loads(message.record_json))
    else:
        record = _record_of(message, {} if cards is None else cards)
    return WorkerInfo(record, message.revision, load)


def _record_of(message: pb.Worker, cards: dict[str, ModelCard]) -> WorkerRecord:
    text = message.model_card_json
    card = cards.get(text) if text else None
    if card is None:
        card = ModelCard.from_json(json.loads(text)) if text else ModelCard(name=message.model)
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
    cards: dict[str, ModelCard] = {}
    return [worker_from_pb(m, cards) for m in messages]
