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
    (``rank``: BLAKE2b; Python's ``hash`` differs per process). The placed workers by id,
    then the leavers by (in flight, cached blocks, id), fill the short pools in sorted
    taint order.

Too costly
    A spread over more than ``policy.MAX_SPREAD_CELLS`` pools times domain values plans no
    moves; ``Plan.refused`` says why (the apply refused it; workers joined since).

Not routable
    A worker that is unhealthy, cordoned or draining is neither counted nor moved: its
    pool taints stay as they are (a drained worker comes back to its pool) and it is listed
    in ``Plan.excluded``. Its leaving makes room that the same plan refills at once.

Elastic
    A policy with an ``elastic`` section planned with an ``ElasticInput`` (what routers hold waiting
    per pool, the hysteresis window, the time) counts by demand instead (``elastic.py``): a
    pool's demand is the in flight of the workers counted under it plus its waiting
    requests; its want follows the demand, settled by the window; the counts are the
    allotment of the routable workers by those wants. The moves are chosen as above, and
    those that shift workers between pools say ``demand``: the counts are the demand's
    allotment (an idle fleet's is the weighted split). ``Plan.window`` is the window to
    keep.

A ``Move`` means: the worker's pool taints of this policy become exactly ``to_pool``.
``Plan.moves`` is in priority order (``first_moves`` takes a budget's worth).
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import attrgetter
from typing import Final, Literal, NamedTuple

from dynamod.pools import elastic
from dynamod.pools.apportion import Domain, apportion, spread
from dynamod.pools.elastic import Window
from dynamod.pools.policy import PoolPolicy, spread_refusal

Why = Literal["joined", "fixup", "drift", "rebalance", "demand"]
WHYS: Final[tuple[Why, ...]] = ("joined", "fixup", "drift", "rebalance", "demand")
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


class ElasticInput(NamedTuple):
    """What an elastic policy's counts follow beside its workers' in flight: the requests
    every router holds waiting for each pool, the hysteresis window as last kept, and the
    wall-clock time now (the window's entries are wall-clock times)."""

    waiting: Mapping[str, int]
    window: Window
    now: float


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
    refused: str = ""
    """Why nothing is planned: the spread is over ``MAX_SPREAD_CELLS`` (workers of new
    domain values joined since the apply); empty otherwise."""
    demand: Mapping[str, float] = field(default_factory=dict)
    """An elastic plan's demand per pool: in flight plus waiting (empty otherwise)."""
    want: Mapping[str, int] = field(default_factory=dict)
    """An elastic plan's want per pool, settled by the window (empty otherwise)."""
    window: Window | None = None
    """An elastic plan's hysteresis window, with this plan's wants in it."""

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
    load: ElasticInput | None = None,
) -> Plan:
    """The counts and moves for ``policy`` over ``workers`` (those its selector selects).

    ``assigned`` is the pool the caller last set on each worker (the leader's memory of
    its own writes; empty on a fresh leader): a worker whose pool taints differ from it is
    drift, and a routable one is counted under its assigned pool and put back. Without it
    the workers' current taints are the truth. ``load``: an elastic policy's counts follow
    its demand (the module docstring); without it they are the weighted split.
    """
    fleet = _Fleet(policy, assigned or {})
    fleet.add_all(workers)
    wanted = apportion(fleet.size, policy.pools, minimum=policy.min_per_pool)
    demand: dict[str, float] = {}
    want: dict[str, int] = {}
    window = None
    if policy.elastic is not None and load is not None:
        demand = fleet.demand(load.waiting)
        raw = elastic.want(policy, demand, load.window.latest)
        want, window = load.window.settle(raw, load.now, policy.elastic.scale_down_after)
        wanted = elastic.allot(fleet.size, policy, want)
    by_domain: dict[Domain, dict[str, int]] = {}
    targets: Mapping[Domain, Mapping[str, int]] = {None: wanted}
    if policy.spread_by is not None:
        refused = spread_refusal(policy, len(fleet.groups))
        if refused:
            return Plan(policy.name, wanted, fleet.actual(), (), refused=refused)
        targets = by_domain = spread(wanted, fleet.sizes(), fleet.have())
    moves = _Moves(policy.name, "demand" if want else "rebalance")
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
        demand=demand,
        want=want,
        window=window,
    )


def first_moves(plan: Plan, budget: int | None) -> tuple[Move, ...]:
    """The first ``budget`` moves of ``plan`` (all of them when ``budget`` is None, as
    ``MoveBudget.allowed`` says without a budget), in priority order: workers serving no
    pool (joined, then fixup), then drift put back, each by worker id, then rebalance by
    least in flight, fewest cached blocks, worker id. Any prefix is safe to apply alone:
    each move only fills a pool that is under its count."""
    return plan.moves if budget is None else plan.moves[: max(budget, 0)]


def rank(policy: str, worker: str) -> str:
    """The stable tie-break of (policy, worker): an 8-byte BLAKE2b of both, in hex, the
    same on every machine and run (hashlib's; Python's ``hash`` differs per process)."""
    return _rank_key(policy)(OwnedWorker(worker))[:16]


def _rank_key(policy: str) -> Callable[[OwnedWorker], str]:
    """A sort key by ``rank``, then worker id (the hex has a fixed width, so one string
    compares both). The policy's part of the hash is computed once and copied, cheaper
    than hashing anew for thousands of tied workers; the name is length-prefixed, so no
    two (policy, worker) pairs feed the hash the same bytes."""
    base = hashlib.blake2b(
        f"{len(policy)}:{policy}".encode("utf-8", "surrogatepass"), digest_size=8
    )

    def key(worker: OwnedWorker) -> str:
        digest = base.copy()
        digest.update(worker.worker.encode("utf-8", "surrogatepass"))
        return digest.hexdigest() + worker.worker

    return key


_LOAD_KEYS = (attrgetter("in_flight"), attrgetter("cached_blocks"))
_leaver_order = attrgetter("in_flight", "cached_blocks", "worker")
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
        for worker in sorted(leaving, key=_leaver_order):
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
        a write anyway), then the least loaded."""
        drifted = [w for w in bucket if w.worker in self.drifted] if self.drifted else []
        if len(drifted) >= surplus:
            return sorted(drifted, key=_worker_id)[:surplus]
        rest = [w for w in bucket if w.worker not in self.drifted] if drifted else bucket
        return drifted + _least_loaded(rest, surplus - len(drifted), policy)


def _least_loaded(workers: list[OwnedWorker], count: int, policy: str) -> list[OwnedWorker]:
    """The ``count`` workers with the least in flight, then the fewest cached blocks, then
    the smallest ``rank``. One sort per key, each over the workers still tied at the cut
    only: the hash is computed for the last ones tied, and a whole fleet of ties (an idle
    fleet) costs one hash per worker, never more."""
    chosen: list[OwnedWorker] = []
    tied = workers
    for key in _LOAD_KEYS:
        ordered = sorted(tied, key=key)
        need = count - len(chosen)
        cut = key(ordered[need - 1])
        low = bisect_left(ordered, cut, key=key)
        high = bisect_right(ordered, cut, lo=need - 1, key=key)
        chosen += ordered[:low]
        if high == need:
            return chosen + ordered[low:need]
        tied = ordered[low:high]
    tied.sort(key=_rank_key(policy))
    return chosen + tied[: count - len(chosen)]


class _Moves:
    """The moves of one plan by reason, and their final order."""

    def __init__(self, policy: str, shift: Why = "rebalance") -> None:
        self.policy = policy
        self.shift = shift
        """Why a worker leaves a pool over its count: ``rebalance``, or ``demand`` when the
        counts follow an elastic policy's demand."""
        self.by_why: dict[Why, list[Move]] = {why: [] for why in WHYS}
        self.load: dict[str, tuple[int, int]] = {}

    def place(self, workers: list[OwnedWorker], why: Why, places: Iterator[str]) -> None:
        """Workers holding none or several pools, in worker id order, into the next places
        (inline: a fleet that starts at once places every worker)."""
        workers.sort(key=_worker_id)
        ids = map(_worker_id, workers)  # first: zip stops there, before taking a place
        self.by_why[why] += map(Move._make, zip(ids, repeat(None), places, repeat(why)))

    def add(self, worker: OwnedWorker, to: str, why: Why) -> None:
        held = worker.pools[0] if len(worker.pools) == 1 else None
        if held == to:
            return  # drift that the plan moves back where the worker already is
        if why == "rebalance":
            why = self.shift
        self.by_why[why].append(Move(worker.worker, held, to, why))
        if why == self.shift:
            self.load[worker.worker] = (worker.in_flight, worker.cached_blocks)

    def ordered(self, merge: bool) -> tuple[Move, ...]:
        """Joined, fixup, drift by worker id; rebalance by (in flight, cached blocks, id).
        One group's lists are in order already; several groups' are merged."""
        if merge:
            for why in ("joined", "fixup", "drift"):
                self.by_why[why].sort(key=_worker_id)
            self.by_why[self.shift].sort(key=self._rebalance_order)
        else:
            self.by_why["drift"].sort(key=_worker_id)
        return tuple(chain.from_iterable(self.by_why[why] for why in WHYS))

    def _rebalance_order(self, move: Move) -> tuple[int, int, str]:
        in_flight, cached = self.load[move.worker]
        return (in_flight, cached, move.worker)


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
        # The common case inline (routable, one pool or none, as assigned): this loop is
        # most of a plan's time at 10,000 workers.
        only = None if self.spread else self._group(None)
        assigned = self.assigned
        for worker in workers:
            held = worker.pools
            if worker.routable and len(held) < 2:
                mine = assigned.get(worker.worker) if assigned else None
                group = only or self._group(worker.domain)
                if not held and mine is None:
                    group.joined.append(worker)
                    continue
                if held and mine in (None, held[0]):
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

    def demand(self, waiting: Mapping[str, int]) -> dict[str, float]:
        """Each pool's in flight (its routable workers counted under it) plus ``waiting``."""
        counts = {pool: float(waiting.get(pool, 0)) for pool in self.pools}
        for group in self.groups.values():
            for pool, bucket in group.buckets.items():
                counts[pool] += sum(w.in_flight for w in bucket)
        return counts

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
