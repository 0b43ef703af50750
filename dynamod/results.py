"""What the daemon reports to its clients, as plain frozen dataclasses (no gRPC, no protobuf).

A worker as listed (``WorkerInfo``, a page of them: ``WorkerPage``), the outcome of a
taint update on one worker (``UpdateOutcome``), a discovery event (``EventInfo``), a routing
explanation (``ExplainInfo``) and the daemon's status (``StatusInfo``). ``control.py`` builds them,
``api/convert.py`` puts them on the wire and back, and ``dynamod.client`` hands them to
dynamoctl and to Python programs.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from dynamod import errors
from dynamod.engine_events import EngineLoad
from dynamod.errors import DynamoError, code_name
from dynamod.load import IDLE, Load
from dynamod.pool_results import PoolEventInfo
from dynamod.records import WorkerRecord, mdcsum
from dynamod.taints import is_topology


@dataclass(frozen=True)
class WorkerInfo:
    """One worker: its record as stored, the record's revision, what the reporting
    daemon's router has in flight there, and what the worker's engine last reported
    (None when the daemon knows nothing of it).

    ``taints`` is the complete normalized set the router matches on, the generated
    ``dynamo.topology/`` taints included; ``caller_taints`` and ``generated_taints`` split
    it into the part callers manage and the part generated from the topology."""

    record: WorkerRecord
    revision: int
    load: Load = IDLE
    engine: EngineLoad | None = None

    @property
    def id(self) -> str:
        return self.record.instance_id

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


EventKind = Literal["ADDED", "TAINTS", "REMOVED", "RESYNC", "POOL"]


@dataclass(frozen=True)
class EventInfo:
    kind: EventKind
    revision: int
    time: float
    worker: WorkerInfo | None = None
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    workers: tuple[WorkerInfo, ...] = ()
    pool: PoolEventInfo | None = None
    """POOL: the pool event (a tail that asked for pool events; ``pool_results``)."""


@dataclass(frozen=True)
class CandidateInfo:
    worker: WorkerInfo
    eligible: bool
    reason: str
    load_cost: float
    overlap_credit: float
    overlap_blocks: int
    preference: float
    multiplier: float
    cost: float
    rank: int
    overlap_source: str = "approximate"
    """Where the overlap comes from: ``kv`` (the worker's engine's own KV cache events) or
    ``approximate`` (the blocks this daemon recently sent it)."""


@dataclass(frozen=True)
class ExplainInfo:
    candidates: tuple[CandidateInfo, ...]
    chosen: str
    summary: str


class DaemonState(enum.StrEnum):
    """Where the daemon is in its life (``dynamoctl status``, ``/health``)."""

    STARTING = "starting"
    """Waiting for the first snapshot of the store; not serving yet."""
    SERVING = "serving"
    DRAINING = "draining"
    """Shutting down: refusing new work, finishing what is in flight."""


@dataclass(frozen=True)
class StatusInfo:
    version: str
    store_url: str
    store_healthy: bool
    store_error: str
    workers: int
    uptime_seconds: float
    replica_id: str
    queue_depth: int
    revision: int
    state: DaemonState
