"""The daemon's reports beyond workers and taint updates (``dynamod.results``), as plain
frozen dataclasses: a discovery event (``EventInfo``), a routing explanation
(``ExplainInfo``), the daemon's status (``StatusInfo``) and a drain as it goes
(``DrainStatus``, ``DrainEvent``, ``DrainResult``). Apart from ``results`` so that a listing
or a taint update, what scripts run in loops, never builds these classes."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from dynamod.results import InFlight, UpdateOutcome, WorkerInfo, WorkerState

if TYPE_CHECKING:  # an annotation only
    from dynamod.pool_results import PoolEventInfo


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
    state_store_url: str = ""
    """Where pool policies, their history and the pool leader's key are kept."""
    open_files: int = -1
    """Descriptors the daemon has open now (-1: not known)."""
    open_files_limit: int = 0
    """Its soft limit on open files (0: not known; an older daemon)."""


@dataclass(frozen=True)
class DrainStatus:
    """One worker while a drain is waited for: its state and what is in flight there;
    ``draining``: it still holds the drain taint (false once uncordoned); ``gone``: it left
    mid-drain, its record gone from the view or its engine's stream broken (killed before
    its lease ran out); then ``in_flight`` is what was in flight when it was last seen,
    which may have been cut. A gone worker is not drained: the wait for it is over."""

    worker: str
    key: str
    state: WorkerState
    in_flight: InFlight
    draining: bool = True
    gone: bool = False

    @property
    def drained(self) -> bool:
        """Drained: still draining, nothing in flight, and not gone."""
        return self.draining and not self.gone and self.in_flight.idle

    @property
    def over(self) -> bool:
        """The wait for it is over: drained, gone, or its drain ended (uncordoned)."""
        return self.drained or self.gone or not self.draining

    def describe(self) -> str:
        """``draining: router 1, engine running 1, waiting 0`` and the like."""
        if self.gone:
            return f"gone mid-drain (killed or left) with {self.in_flight.describe()} in flight"
        if not self.draining:
            return f"{self.state}: not draining (uncordoned, or never drained)"
        return f"{self.state}: {self.in_flight.describe()}"


@dataclass(frozen=True)
class DrainEvent:
    """One message of a drain wait: the workers whose figures changed (every worker waited
    for in the first message). The ``last`` one says how it ended: ``drained`` (every
    worker drained), ``timed_out`` (the timeout passed first), or neither (some drain
    ended without draining: uncordoned)."""

    workers: tuple[DrainStatus, ...]
    last: bool = False
    drained: bool = False
    timed_out: bool = False


@dataclass(frozen=True)
class DrainResult:
    """A whole drain (``AsyncClient.drain``): the cordon's outcome on each worker (a failed
    one carries its ``error``), each worker as the wait last saw it, and whether every
    worker was cordoned and drained before the timeout."""

    cordoned: tuple[UpdateOutcome, ...]
    workers: tuple[DrainStatus, ...]
    drained: bool
    timed_out: bool = False

    @property
    def busy(self) -> tuple[DrainStatus, ...]:
        """The workers not drained, by id."""
        return tuple(w for w in self.workers if not w.drained)

    @classmethod
    def of(
        cls,
        cordoned: Iterable[UpdateOutcome],
        seen: Mapping[str, DrainStatus],
        last: DrainEvent | None,
    ) -> DrainResult:
        """The result from the cordon's outcomes, the latest status of each worker (by
        key) and the wait's last event (None: the wait ended without one)."""
        outcomes = tuple(cordoned)
        failed = any(c.error is not None for c in outcomes)
        workers = tuple(sorted(seen.values(), key=lambda w: (w.worker, w.key)))
        drained = last is not None and last.drained and not failed
        return cls(outcomes, workers, drained, last is not None and last.timed_out)
