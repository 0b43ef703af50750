"""What the daemon reports about pool policies, as plain frozen dataclasses (no gRPC).

A stored policy (``PolicyInfo``), the outcome of an apply (``ApplyOutcome``) or a removal
(``RemoveOutcome``), one move of a worker between pools (``PoolMove``: pending, or made
by a leader with its fencing epoch), drift the leader saw (``DriftSeen``), a move that
failed (``MoveFailure``), a policy's status (``PoolStatusInfo``) and a pool event in
``events tail`` (``PoolEventInfo``).
``dynamod.pools`` builds them, ``api/pool_convert.py`` puts them on the wire and back,
and ``dynamod.client`` hands them to dynamoctl and to Python programs. The pool taints of
a policy are its ``pools``: taint -> weight.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

ApplyKind = Literal["created", "changed", "unchanged"]
PoolEventKind = Literal[
    "APPLIED", "CHANGED", "PAUSED", "RESUMED", "REMOVED", "MOVED", "DRIFT", "LEADER", "LOST"
]
POOL_EVENT_KINDS: tuple[PoolEventKind, ...] = (
    "APPLIED", "CHANGED", "PAUSED", "RESUMED", "REMOVED", "MOVED", "DRIFT", "LEADER", "LOST",
)  # fmt: skip
"""APPLIED: a policy was created; CHANGED: its document changed (other than ``paused``);
PAUSED / RESUMED; REMOVED; MOVED: the leader set a worker's pool; DRIFT: the leader saw a
pool taint of an owned worker changed by another writer; LEADER: a daemon began to lead
the pools (its epoch); LOST: this stream fell behind and pool events were dropped."""


@dataclass(frozen=True)
class PolicyInfo:
    """A stored policy: its document (``PoolPolicy.to_dict()``: the keys that differ from
    their defaults), the store revision of its key, and the pool taints of the versions it
    replaced that the leader strips from its workers (``retired``)."""

    name: str
    revision: int
    document: Mapping[str, object] = field(hash=False)
    retired: tuple[str, ...] = ()

    @property
    def selector(self) -> str:
        return str(self.document.get("selector", ""))

    @property
    def pools(self) -> dict[str, float]:
        pools = self.document.get("pools", {})
        return dict(pools) if isinstance(pools, Mapping) else {}

    @property
    def paused(self) -> bool:
        return bool(self.document.get("paused", False))


@dataclass(frozen=True)
class PoolMove:
    """One worker's move between pools: its pool taints of the policy become exactly
    ``to_pool``. ``from_pool`` is the one pool it held ("" when none or several); ``why``:
    joined, fixup, drift, rebalance, demand (a shift between an elastic policy's pools:
    its counts follow their demand), or retired (a replaced version's pool
    taint stripped). A pending move has no ``time``, ``epoch`` or ``revision`` (0); a move made
    carries when, the leader's fencing ``epoch`` and name, and the record's revision
    after it. ``reconciled``: the leader that wrote a made move into the history at its
    start, because the leader that made it died between the store's write and the log
    (``pools/intents.py``); its ``time`` is when the move was sent."""

    worker: str
    from_pool: str
    to_pool: str
    why: str
    time: float = 0.0
    epoch: int = 0
    revision: int = 0
    leader: str = ""
    reconciled: str = ""


@dataclass(frozen=True)
class DriftSeen:
    """A pool taint of an owned worker changed by another writer: the policy's pool taints
    it held then (``held``), the pool the leader had set (``assigned``), the record's
    revision, when the leader saw it, and what it did: ``put back``, or ``left`` (the policy
    is paused, or the worker is not routable: nothing is written)."""

    worker: str
    held: tuple[str, ...]
    assigned: str
    revision: int
    time: float
    action: str


@dataclass(frozen=True)
class MoveFailure:
    """A worker whose move the leader could not make: the pool it was to move to, the last
    error (its class and message), the failed attempts in a row, and the wall-clock time
    of the next attempt; ``refused``: the daemon refused the move (``next_time`` is 0), so
    it is tried again only once the policy, the worker's record or the daemon's settings
    change."""

    worker: str
    to_pool: str
    error: str
    attempts: int
    next_time: float
    refused: bool = False


@dataclass(frozen=True)
class PoolCount:
    """One pool of a policy: its weight, the routable workers it should have and has; for
    an elastic policy also its demand (requests in flight plus waiting) and the workers that
    demand wants (None otherwise)."""

    pool: str
    weight: float
    wanted: int
    actual: int
    demand: float | None = None
    want: int | None = None


@dataclass(frozen=True)
class PoolStatusInfo:
    """A policy as the answering daemon sees it now.

    ``leader`` / ``epoch``: who leads the pools (empty and 0 when nobody does);
    ``leading``: whether the answering daemon (``replica``) is that leader. The counts,
    ``pending`` moves and ``excluded`` workers are the plan this daemon computes from its
    own view (the leader's, with what it assigned; a follower's from the taints alone).
    ``recent`` moves and ``drift`` come from the leader's history in the store, the newest
    last. ``budget_left``: moves the leader may still make in the budget's window (None
    without ``max_moves``, or on a follower). ``conflict``: why the policy is not
    reconciled, when it overlaps another stored policy ("" otherwise). ``failing``: the
    workers whose moves failed, with why and when the leader tries again (the leader
    only: a follower shows none)."""

    policy: PolicyInfo
    replica: str
    leader: str
    epoch: int
    leading: bool
    workers: int
    pools: tuple[PoolCount, ...]
    by_domain: Mapping[str, Mapping[str, int]] = field(default_factory=dict, hash=False)
    pending: tuple[PoolMove, ...] = ()
    excluded: tuple[str, ...] = ()
    recent: tuple[PoolMove, ...] = ()
    drift: tuple[DriftSeen, ...] = ()
    budget_left: int | None = None
    conflict: str = ""
    failing: tuple[MoveFailure, ...] = ()

    @property
    def balanced(self) -> bool:
        return not self.pending


@dataclass(frozen=True)
class ApplyOutcome:
    """What an apply did (``created``, ``changed`` or ``unchanged``; nothing is written for
    a dry run or an unchanged document) and the moves the answering daemon plans for the
    policy as applied, from its view now."""

    policy: PolicyInfo
    outcome: ApplyKind
    moves: tuple[PoolMove, ...] = ()
    dry_run: bool = False


@dataclass(frozen=True)
class RemoveOutcome:
    """A removed policy, and how many workers still hold one of its pool taints: removing a
    policy leaves every taint as it is."""

    policy: PolicyInfo
    workers_holding: int


@dataclass(frozen=True)
class PoolEventInfo:
    """A pool event (``events tail``): ``kind`` (``POOL_EVENT_KINDS``), the policy, and for
    MOVED and DRIFT the worker and its pools (``from_pool`` -> ``to_pool``; DRIFT: ``held``
    and ``to_pool`` the assigned pool), ``why`` and the leader's ``epoch``. ``message`` says
    it in words."""

    kind: PoolEventKind
    policy: str
    worker: str = ""
    from_pool: str = ""
    to_pool: str = ""
    why: str = ""
    epoch: int = 0
    leader: str = ""
    held: tuple[str, ...] = ()
    message: str = ""
