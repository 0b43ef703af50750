"""The pool plan: from a policy and the workers it owns to the fewest moves.

Pure and deterministic: no I/O, no clock, no randomness, and the same workers in any order
give the same ``Plan``, so every dynamod computes the leader's plan (followers show it in
``status``; only the leader writes it). Counts come from ``apportion``.

Who moves
    A routable worker holding none of the policy's pool taints is placed ("joined"); one
    holding several keeps one ("fixup"); one whose pool taints differ from what the caller
    last assigned it is put back ("drift"). Only pools over their count give workers up
    ("rebalance"), each exactly its surplus, and those workers with the placed ones fill
    the pools under their count. So the number of moves is ``sum(max(0, have - want))``
    over the pools (per domain with ``spread_by``) plus the workers holding none or
    several, plus drift put back: the fewest possible. A pool gives up first the workers
    that need a write anyway (drifted), then those with the least work in flight, then the
    fewest cached prefix blocks, then the smallest stable hash of (policy, worker id)
    (SHA-256; Python's ``hash`` differs per process). Placed workers, in worker id order,
    then leavers, in that order, fill the short pools in sorted taint order.

Not routable
    A worker that is unhealthy, cordoned or draining is neither counted nor moved: its
    pool taints stay as they are (a drained worker comes back to its pool) and it is listed
    in ``Plan.excluded``. Its leaving makes room that the same plan refills at once.

A ``Move`` means: the worker's pool taints of this policy become exactly ``to_pool``.
``Plan.moves`` is in priority order (``first_moves`` takes a budget's worth).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Final, Literal, NamedTuple

from dynamod.pools.apportion import Domain, apportion, spread
from dynamod.pools.policy import PoolPolicy

Why = Literal["joined", "fixup", "drift", "rebalance"]
WHYS: Final[tuple[Why, ...]] = ("joined", "fixup", "drift", "rebalance")
"""Every reason for a move, in priority order: a worker serving no pool first."""


class OwnedWorker(NamedTuple):
    """A worker the policy owns, as the plan sees it (a tuple: a plan takes thousands).

    ``pools``: the policy's pool taints it holds now (``held_pools``); ``domain``: its
    value of the policy's ``spread_by`` domain, None without one; ``routable``: False when
    it is unhealthy, cordoned or draining.
    """

    worker: str
    pools: tuple[str, ...] = ()
    in_flight: int = 0
    cached_blocks: int = 0
    domain: Domain = None
    routable: bool = True


class Move(NamedTuple):
    """Set ``worker``'s pool taints of the policy to exactly ``to_pool``. ``from_pool`` is
    the one pool it held, None when it held none or several."""

    worker: str
    from_pool: str | None
    to_pool: str
    why: Why


@dataclass(frozen=True)
class Plan:
    """What a policy wants of its workers now, and the moves that get there.

    ``wanted`` and ``actual`` count routable workers per pool (``actual``: those holding
    exactly that one pool); ``wanted_by_domain`` is the spread, domain -> pool -> count
    (empty without ``spread_by``); ``excluded`` the non-routable workers, not counted and
    not moved; ``drift`` the workers whose pool taints differ from what the caller
    assigned, routable or not (only routable ones are put back, and a paused policy
    applies nothing).
    """

    policy: str
    wanted: Mapping[str, int]
    actual: Mapping[str, int]
    moves: tuple[Move, ...]
    wanted_by_domain: Mapping[Domain, Mapping[str, int]] = field(default_factory=dict)
    excluded: tuple[str, ...] = ()
    drift: tuple[str, ...] = ()

    @property
    def balanced(self) -> bool:
        return not self.moves


def held_pools(taints: Iterable[str], policy: PoolPolicy) -> tuple[str, ...]:
    """The policy's pool taints among ``taints``, sorted: ``OwnedWorker.pools``."""
    return tuple(sorted(t for t in taints if t in policy.pools))


def plan(
    policy: PoolPolicy,
    workers: Iterable[OwnedWorker],
    *,
    assigned: Mapping[str, str] | None = None,
) -> Plan:
    """The counts and moves for ``policy`` over ``workers`` (those its selector selects).

    ``assigned`` is the pool the caller last set on each worker (the leader's memory of
    its own writes; empty on a fresh leader): a worker whose pool taints differ from it is
    drift, and a routable one is counted under its assigned pool and put back. Without it
    the workers' current taints are the truth.
    """
    fleet = _Fleet(policy, assigned or {})
    fleet.add_all(workers)
    wanted = apportion(fleet.size, policy.pools, minimum=policy.min_per_pool)
    by_domain: dict[Domain, dict[str, int]] = {}
    targets: Mapping[Domain, Mapping[str, int]] = {None: wanted}
    if policy.spread_by is not None:
        targets = by_domain = spread(wanted, fleet.sizes(), fleet.have())
    moves = _Moves(policy.name)
    for domain, group in fleet.groups.items():
        group.moves(targets[domain], moves)
    return Plan(
        policy=policy.name,
        wanted=wanted,
        actual=fleet.actual(),
        moves=moves.ordered(len(fleet.groups) > 1),
        wanted_by_domain=by_domain,
        excluded=tuple(sorted(fleet.excluded)),
        drift=tuple(sorted(fleet.drift)),
    )


def first_moves(plan: Plan, budget: int | None) -> tuple[Move, ...]:
    """The first ``budget`` moves of ``plan`` (all of them when ``budget`` is None, as
    ``MoveBudget.allowed`` says without a budget), in priority order: workers serving no
    pool (joined, then fixup), then drift put back, then rebalance in the leavers' order
    (least in flight, fewest cached blocks, stable hash). Any prefix is safe to apply
    alone: each move only fills a pool that is under its count."""
    return plan.moves if budget is None else plan.moves[: max(budget, 0)]


@functools.lru_cache(maxsize=1 << 16)
def rank(policy: str, worker: str) -> bytes:
    """The stable tie-break of (policy, worker): the first 8 bytes of a SHA-256, the same
    on every machine and run. Cached: a fleet's ranks do not change between plans."""
    data = f"{len(policy)}:{policy}{worker}".encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).digest()[:8]


_load = attrgetter("in_flight", "cached_blocks")
_worker_id = attrgetter("worker")


class _Group:
    """The routable workers of one domain (the whole fleet without ``spread_by``) by the
    pool each counts under; those counted under none wait to be placed."""

    def __init__(self, pools: Iterable[str]) -> None:
        self.buckets: dict[str, list[OwnedWorker]] = {pool: [] for pool in pools}
        self.joined: list[OwnedWorker] = []
        """Workers holding none of the pools."""
        self.fixup: list[OwnedWorker] = []
        """Workers holding several of the pools."""
        self.drifted: dict[str, str] = {}
        """Worker id -> the assigned pool it is counted under and put back into."""

    def moves(self, targets: Mapping[str, int], out: _Moves) -> None:
        """The fewest moves to ``targets``: each pool over its count gives up its surplus,
        and those workers with the unplaced ones fill the pools under their count."""
        leaving: list[OwnedWorker] = []
        gaps: list[str] = []
        for pool, bucket in self.buckets.items():
            surplus = len(bucket) - targets[pool]
            if surplus > 0:
                leaving += self._leavers(bucket, surplus, out.policy)
            gaps += [pool] * -surplus
        if len(gaps) != len(self.joined) + len(self.fixup) + len(leaving):
            raise AssertionError(f"{len(gaps)} places for {len(self.joined)} + ... workers")
        places = iter(gaps)
        out.place(self.joined, "joined", places)
        out.place(self.fixup, "fixup", places)
        for worker in sorted(leaving, key=out.leaver_order):
            out.add(worker, next(places), self._why(worker))
        if self.drifted:
            self._put_back({w.worker for w in leaving}, out)

    def _put_back(self, leaving: set[str], out: _Moves) -> None:
        """Drifted workers that stay in their assigned pool go back to it."""
        for pool, bucket in self.buckets.items():
            for worker in bucket:
                if worker.worker in self.drifted and worker.worker not in leaving:
                    out.add(worker, pool, "drift")

    def _why(self, leaver: OwnedWorker) -> Why:
        return "drift" if leaver.worker in self.drifted else "rebalance"

    def _leavers(self, bucket: list[OwnedWorker], surplus: int, policy: str) -> list[OwnedWorker]:
        """The ``surplus`` workers of ``bucket`` that leave: drifted ones first (they need
        a write anyway), then by load; the stable hash only decides among the workers tied
        at the cut (hashing them all would double a plan's time at 10,000 workers)."""
        drifted = [w for w in bucket if w.worker in self.drifted] if self.drifted else []
        if len(drifted) >= surplus:
            return sorted(drifted, key=_worker_id)[:surplus]
        rest = [w for w in bucket if w.worker not in self.drifted] if drifted else bucket
        return drifted + _least_loaded(rest, surplus - len(drifted), policy)


def _least_loaded(workers: list[OwnedWorker], count: int, policy: str) -> list[OwnedWorker]:
    ordered = sorted(workers, key=_load)
    cut = _load(ordered[count - 1])
    low = count - 1
    while low > 0 and _load(ordered[low - 1]) == cut:
        low -= 1
    high = count
    while high < len(ordered) and _load(ordered[high]) == cut:
        high += 1
    if high == count:
        return ordered[:count]
    tied = sorted(ordered[low:high], key=lambda w: (rank(policy, w.worker), w.worker))
    return ordered[:low] + tied[: count - low]


class _Moves:
    """The moves of one plan by reason, and their final order."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self.by_why: dict[Why, list[Move]] = {why: [] for why in WHYS}
        self.load: dict[str, tuple[int, int]] = {}

    def place(self, workers: list[OwnedWorker], why: Why, places: Iterator[str]) -> None:
        """Workers holding none or several pools, in worker id order, into the next places
        (inline: a fleet that starts at once places every worker)."""
        workers.sort(key=_worker_id)
        moves = self.by_why[why]
        for worker in workers:
            moves.append(Move(worker.worker, None, next(places), why))

    def add(self, worker: OwnedWorker, to: str, why: Why) -> None:
        held = worker.pools[0] if len(worker.pools) == 1 else None
        if held == to:
            return  # drift that the plan moves back where the worker already is
        self.by_why[why].append(Move(worker.worker, held, to, why))
        if why == "rebalance":
            self.load[worker.worker] = (worker.in_flight, worker.cached_blocks)

    def leaver_order(self, worker: OwnedWorker) -> tuple[int, int, bytes, str]:
        return (
            worker.in_flight,
            worker.cached_blocks,
            rank(self.policy, worker.worker),
            worker.worker,
        )

    def ordered(self, merge: bool) -> tuple[Move, ...]:
        """Joined, fixup, drift by worker id; rebalance in the leavers' order. One group's
        lists are in order already; several groups' are merged."""
        if merge:
            for why in ("joined", "fixup", "drift"):
                self.by_why[why].sort(key=_worker_id)
            self.by_why["rebalance"].sort(key=self._rebalance_order)
        else:
            self.by_why["drift"].sort(key=_worker_id)
        return tuple(move for why in WHYS for move in self.by_why[why])

    def _rebalance_order(self, move: Move) -> tuple[int, int, bytes, str]:
        in_flight, cached = self.load[move.worker]
        return (in_flight, cached, rank(self.policy, move.worker), move.worker)


class _Fleet:
    """The owned workers sorted out for one plan: routable ones into groups (one per
    domain value with ``spread_by``), the others excluded; drift noted."""

    def __init__(self, policy: PoolPolicy, assigned: Mapping[str, str]) -> None:
        self.pools = policy.pools
        self.spread = policy.spread_by is not None
        self.assigned = assigned
        self.groups: dict[Domain, _Group] = {}
        self.excluded: list[str] = []
        self.drift: list[str] = []
        self.moved_back: list[tuple[str, str | None]] = []  # (assigned, held) of drift

    def add_all(self, workers: Iterable[OwnedWorker]) -> None:
        # The common case inline (routable, one pool, no drift to look for): this loop is
        # most of a plan's time at 10,000 workers.
        only = None if self.spread else self._group(None)
        for worker in workers:
            held = worker.pools
            if worker.routable and len(held) < 2 and not self.assigned:
                group = only or self._group(worker.domain)
                if not held:
                    group.joined.append(worker)
                    continue
                bucket = group.buckets.get(held[0])
                if bucket is not None:
                    bucket.append(worker)
                    continue
            self._add(worker)

    def _add(self, worker: OwnedWorker) -> None:
        held = tuple(t for t in worker.pools if t in self.pools)
        mine = self.assigned.get(worker.worker)
        drifted = mine is not None and mine in self.pools and held != (mine,)
        if drifted:
            self.drift.append(worker.worker)
        if not worker.routable:
            self.excluded.append(worker.worker)
            return
        group = self._group(worker.domain)
        if drifted and mine is not None:
            group.buckets[mine].append(worker)
            group.drifted[worker.worker] = mine
            self.moved_back.append((mine, held[0] if len(held) == 1 else None))
        elif len(held) == 1:
            group.buckets[held[0]].append(worker)
        else:
            (group.fixup if held else group.joined).append(worker)

    def _group(self, domain: Domain) -> _Group:
        key = domain if self.spread else None
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = _Group(self.pools)
        return group

    @property
    def size(self) -> int:
        return sum(self.sizes().values())

    def sizes(self) -> dict[Domain, int]:
        return {
            domain: sum(map(len, group.buckets.values())) + len(group.joined) + len(group.fixup)
            for domain, group in self.groups.items()
        }

    def have(self) -> dict[tuple[Domain, str], int]:
        return {(d, p): len(b) for d, g in self.groups.items() for p, b in g.buckets.items()}

    def actual(self) -> dict[str, int]:
        """Routable workers holding exactly one pool, by pool: the buckets, less the drifted
        workers counted under their assigned pool, plus the pool they really hold."""
        counts = dict.fromkeys(self.pools, 0)
        for (_, pool), count in self.have().items():
            counts[pool] += count
        for assigned, held in self.moved_back:
            counts[assigned] -= 1
            if held is not None:
                counts[held] += 1
        return counts
