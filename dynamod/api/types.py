"""What the API hands out, as plain dataclasses (no gRPC, no protobuf).

The daemon builds these from its view and router; ``api/convert.py`` turns them into wire
messages and back; ``api/client.py`` returns them to dynamoctl.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dynamod.model import WorkerRecord, mdcsum
from dynamod.taints import is_topology


@dataclass(frozen=True)
class Load:
    """What one router has in flight on a worker."""

    active_requests: int = 0
    active_prompt_tokens: int = 0
    active_kv_blocks: int = 0


@dataclass(frozen=True)
class WorkerInfo:
    record: WorkerRecord
    revision: int
    load: Load = Load()

    @property
    def id(self) -> str:
        return self.record.instance_id

    @property
    def mdcsum(self) -> str:
        return mdcsum(self.record.model_card)

    @property
    def caller_taints(self) -> tuple[str, ...]:
        return tuple(t for t in self.record.taints if not is_topology(t))


@dataclass(frozen=True)
class Failure:
    """Why one worker's part of a bulk operation failed: a gRPC status name and message."""

    code: str
    message: str


@dataclass(frozen=True)
class TaintChange:
    worker: str
    key: str
    before: tuple[str, ...]
    after: tuple[str, ...]
    revision: int
    error: Failure | None = None

    @property
    def added(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.after) - set(self.before)))

    @property
    def removed(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.before) - set(self.after)))

    @property
    def changed(self) -> bool:
        return self.before != self.after


EventKind = Literal["ADDED", "TAINTS", "REMOVED", "RESYNC"]


@dataclass(frozen=True)
class EventInfo:
    kind: EventKind
    revision: int
    time: float
    worker: WorkerInfo | None = None
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    workers: tuple[WorkerInfo, ...] = ()


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


@dataclass(frozen=True)
class ExplainInfo:
    candidates: tuple[CandidateInfo, ...]
    chosen: str
    summary: str


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
    state: str
