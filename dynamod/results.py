"""What the daemon reports to its clients, as plain frozen dataclasses (no gRPC, no protobuf).

A worker as listed (``WorkerInfo``, a page of them: ``WorkerPage``) with its state
(``WorkerState``, derived by ``worker_state``), the outcome of a taint update on one worker
(``UpdateOutcome``), a discovery event (``EventInfo``), a routing explanation
(``ExplainInfo``), the daemon's status (``StatusInfo``) and a drain as it goes
(``DrainStatus``, ``DrainEvent``, ``DrainResult``). ``control.py`` builds them,
``api/convert.py`` puts them on the wire and back, and ``dynamod.client`` hands them to
dynamoctl and to Python programs.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dynamod import errors
from dynamod.engine_events import REACH, EngineLoad
from dynamod.errors import DynamoError, code_name
from dynamod.load import IDLE, Load
from dynamod.records import WorkerRecord, mdcsum
from dynamod.taints import CORDONED, DRAINING, OPERATOR_TAINTS, is_topology

if TYPE_CHECKING:  # an annotation only: a listing never pays for the pools' types
    pass


class WorkerState(enum.StrEnum):
    """Where a worker stands for routing (``dynamoctl workers ls`` STATE, JSON ``state``);
    ``worker_state`` says which."""

    READY = "ready"
    """Takes new requests (when it holds what they require)."""
    CORDONED = "cordoned"
    """Takes no new request; what it runs finishes (``dynamoctl workers cordon``)."""
    DRAINING = "draining"
    """Cordoned for a drain, with requests still in flight."""
    DRAINED = "drained"
    """Cordoned for a drain, nothing in flight: safe to stop."""
    UNHEALTHY = "unhealthy"
    """Its engine reports that it cannot serve."""
    EXCLUDED = "excluded"
    """Left out of routing by design, though ready: it reads request bodies otherwise
    (tokenizer, KV block size) than most workers of its model (``router/fit.py``); the
    reason says how (``WorkerInfo.state_reason``)."""
    UNREACHABLE = "unreachable"
    """An NVIDIA Dynamo worker whose port refuses connection (dynamod's own check,
    ``boundary/dynamo_reach.py``): Dynamo's frontend cannot reach it either. Until it
    answers again or its lease ends."""
    CORDON_NOT_HONOURED = "ready,cordon-not-honoured"
    """An NVIDIA Dynamo worker holding an operator taint (the cordon set by hand through
    its route) that Dynamo's router does not honour: it takes new requests all the same.
    ``uncordon`` removes it."""

    @property
    def routable(self) -> bool:
        """Whether new requests may go there (a pool counts only these)."""
        return self in (WorkerState.READY, WorkerState.CORDON_NOT_HONOURED)


@dataclass(frozen=True)
class InFlight:
    """What is in flight on a worker as one daemon sees it: ``requests`` its own router
    has there, and ``running`` / ``waiting`` as the worker's engine last reported them
    (None when the engine reports nothing: no events stream, or one that broke). Another
    daemon's requests show only in the engine's figures."""

    requests: int = 0
    running: int | None = None
    waiting: int | None = None

    @classmethod
    def of(cls, load: Load, engine: EngineLoad | None) -> InFlight:
        if engine is None:
            return cls(load.active_requests)
        return cls(load.active_requests, engine.running, engine.waiting)

    @property
    def idle(self) -> bool:
        """Nothing in flight by any count this daemon has."""
        return self.requests == 0 and not self.running and not self.waiting

    def describe(self) -> str:
        """``router 1, engine running 1, waiting 0`` / ``router 0, engine not reporting``."""
        if self.running is None:
            return f"router {self.requests}, engine not reporting"
        return f"router {self.requests}, engine running {self.running}, waiting {self.waiting}"


def worker_state(
    taints: Collection[str],
    load: Load,
    engine: EngineLoad | None,
    *,
    honours_cordon: bool = True,
) -> WorkerState:
    """A worker's state from its taints, this daemon's load on it and its engine's last
    report. The first that holds, in this order:

    1. ``unreachable``: dynamod's own check finds its port refusing connection
       (``engine_events.REACH``); ``unhealthy``: its engine reports it cannot serve;
    2. ``draining`` / ``drained``: it holds the drain taint (``dynamo.io/draining``):
       draining while anything is in flight (``InFlight.of``: this router's requests, the
       engine's running and waiting where it reports), drained when nothing is;
    3. ``cordoned``: it holds the cordon (``dynamo.io/cordoned``) alone;
    4. ``ready``.

    Where the fleet's router does not honour the operator's taints (``honours_cordon``
    false: an NVIDIA Dynamo worker, ``from_dynamo``), 2 and 3 are what Dynamo routes by:
    ``ready,cordon-not-honoured`` when it holds one, else ``ready``.
    """
    if engine is not None and not engine.healthy:
        return WorkerState.UNREACHABLE if engine.source == REACH else WorkerState.UNHEALTHY
    if not honours_cordon:
        fenced = any(t in OPERATOR_TAINTS for t in taints)
        return WorkerState.CORDON_NOT_HONOURED if fenced else WorkerState.READY
    if DRAINING in taints:
        idle = InFlight.of(load, engine).idle
        return WorkerState.DRAINED if idle else WorkerState.DRAINING
    if CORDONED in taints:
        return WorkerState.CORDONED
    return WorkerState.READY


def from_dynamo(record: WorkerRecord) -> bool:
    """Whether ``record`` is an NVIDIA Dynamo worker's, as ``store/dynamo`` reads one."""
    return bool(dynamo_card_key(record))


def dynamo_card_key(record: WorkerRecord) -> str:
    """An NVIDIA Dynamo worker's own key in its fleet's store (its model card's,
    ``v1/mdc/...``), or ""."""
    found = record.extra.get("dynamo")
    key = found.get("card_key") if isinstance(found, Mapping) else None
    return key if isinstance(key, str) else ""


def own_key(record: WorkerRecord) -> str:
    """The key a worker is shown under: where its own store holds it. ``record.key`` for
    dynamod's workers; for an NVIDIA Dynamo worker, its card's key (``v1/mdc/...``), not
    the key the worker view holds it at."""
    return dynamo_card_key(record) or record.key


def record_state(record: WorkerRecord, load: Load, engine: EngineLoad | None) -> WorkerState:
    """``worker_state`` of a worker's record, this daemon's load on it and its engine's
    report (an NVIDIA Dynamo worker's, by Dynamo's rule)."""
    return worker_state(record.taints, load, engine, honours_cordon=not from_dynamo(record))


@dataclass(frozen=True)
class WorkerInfo:
    """One worker: its record as stored, the record's revision, what the reporting
    daemon's router has in flight there, and what the worker's engine last reported
    (None when the daemon knows nothing of it).

    ``taints`` is the complete normalized set the router matches on, the generated
    ``dynamo.topology/`` taints included; ``caller_taints`` and ``generated_taints`` split
    it into the part callers manage and the part generated from the topology.

    ``state`` is ``record_state`` of the three: given as the daemon sent it, or derived
    here when left out (it is never None once built); ``state_reason`` says why where the
    state alone does not (``excluded``: its reading against its model's). ``key`` is the
    key it is shown under (``own_key``): given as the daemon sent it, or derived here."""

    record: WorkerRecord
    revision: int
    load: Load = IDLE
    engine: EngineLoad | None = None
    state: WorkerState | None = None
    key: str = ""
    state_reason: str = ""

    def __post_init__(self) -> None:
        if self.state is None:
            derived = record_state(self.record, self.load, self.engine)
            object.__setattr__(self, "state", derived)
        if not self.key:
            object.__setattr__(self, "key", own_key(self.record))

    @property
    def id(self) -> str:
        return self.record.instance_id

    @property
    def warning(self) -> str:
        """What an operator must be told of this worker's state, or "": an operator taint
        its fleet's router does not honour (``ready,cordon-not-honoured``)."""
        if self.state is not WorkerState.CORDON_NOT_HONOURED:
            return ""
        held = ", ".join(t for t in self.record.taints if t in OPERATOR_TAINTS)
        return (
            f"worker {self.id} holds {held}, which NVIDIA Dynamo's router does not honour: "
            f"it still gets requests; dynamoctl workers uncordon {self.id} removes it"
        )

    @property
    def model(self) -> str:
        return self.record.model

    @property
    def taints(self) -> tuple[str, ...]:
        return self.record.taints

    @property
    def mdcsum(self) -> str:
        return mdcsum(self.record.model_card)

    @property
    def caller_taints(self) -> tuple[str, ...]:
        return tuple(t for t in self.record.taints if not is_topology(t))

    @property
    def generated_taints(self) -> tuple[str, ...]:
        return tuple(t for t in self.record.taints if is_topology(t))


@dataclass(frozen=True)
class WorkerPage:
    """One page of a streamed listing: its workers (by model, then id), the view's revision
    when the listing began, and ``id_prefix`` (the same on every page)."""

    workers: list[WorkerInfo]
    revision: int
    id_prefix: int


ID_PREFIX = 8
"""The fewest characters of an instance id a listing shows."""


def id_prefix_length(ids: Iterable[str], minimum: int = ID_PREFIX) -> int:
    """The shortest prefix length, at least ``minimum``, that no two of ``ids`` share (the
    daemon accepts any unique prefix of an id)."""
    unique = set(ids)
    length = minimum
    while len({i[:length] for i in unique}) < len(unique):
        length += 1
    return length


@dataclass(frozen=True)
class UpdateFailure:
    """Why one worker's taint update failed: a status code name (``errors.code_name``), the
    error's message, and what rebuilds the error itself (``error()``): its class's
    ``lineage`` and its ``fields``."""

    code: str
    message: str
    lineage: str = ""
    fields: Mapping[str, object] = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, error: DynamoError) -> UpdateFailure:
        return cls(code_name(error), str(error), errors.lineage(error), error.fields())

    def error(self) -> DynamoError:
        """The error as the daemon raised it, with its fields."""
        return errors.rebuild(self.lineage, self.fields, self.message)


@dataclass(frozen=True)
class UpdateOutcome:
    """The outcome of a taint update on one worker: its taints before and after (the
    complete sets), the record's revision after it (or when read, for a dry run or a
    failure), and the error when this worker's update failed."""

    worker: str
    key: str
    before: tuple[str, ...]
    after: tuple[str, ...]
    revision: int
    error: UpdateFailure | None = None

    @property
    def added(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.after) - set(self.before)))

    @property
    def removed(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.before) - set(self.after)))

    @property
    def changed(self) -> bool:
        return self.before != self.after
