"""Elastic pools: from each pool's demand to the workers it is allotted, with hysteresis.

Pure and exact, like ``apportion.py``: the caller brings the demand, the last wants and the
clock; nothing here reads a store or a clock. Three steps, in this order:

Want (``want``)
    An elastic pool (``Elastic.target``: ``t`` requests in flight per worker) with demand
    ``d`` wants ``ceil(d / t)`` workers, read as the decimals they were written as (``0.3 /
    0.1`` is 3, not 4) and less a billionth of a worker, so float noise in a summed demand
    adds none. Like a Kubernetes HPA, a demand within ``tolerance`` of what the current
    want holds (``abs(d / (current * t) - 1) <= tolerance``, with the same billionth to
    spare) keeps that want: noise moves nothing. The current want is the one last
    recommended, not the pool's allotted size (see ``want``). No pool wants fewer than
    ``min_per_pool``; a pool that is not elastic wants exactly that, and takes what the
    elastic ones leave, by weight.

Hysteresis (``Window``)
    A pool's effective want is the largest in force within the last ``scale_down_after``
    seconds (a want is in force from one recommendation to the next): it grows as soon as
    it wants more, and shrinks only once its lower want has lasted that long (an HPA's
    scale-down stabilisation window; between two samples the older want is assumed to
    hold, which only delays a shrink). The window is a value the leader stores
    (``to_json``), so a new leader carries it on instead of shrinking every pool to its
    current want.

Allotment (``allot``)
    When the wants fit in the routable workers, each pool gets what it wants and the rest
    is split by the weights: the plain weighted split (``apportion`` with the minimum),
    where every pool short of its want is held at its want and the workers left are split
    again by weight over the others, until none is short. So an idle fleet, every want
    within its weighted share, shows exactly the plain weighted split. When the wants do
    not fit, the workers are apportioned in proportion to the wants, each pool keeping
    ``min(min_per_pool, n // pools)``. Both are largest remainder with ties by sorted
    taint, as ``apportion`` does; raising one pool's want never lowers its allotment.

The moves toward an allotment are the plan's, so they stay the fewest:
``sum(max(0, have - allotted))`` over the pools, least in flight first.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType

from dynamod.pools.apportion import apportion, exact_decimal
from dynamod.pools.document import brief
from dynamod.pools.policy import Elastic, PoolPolicy

NOISE = Fraction(1, 10**9)
"""Workers of a want ignored before rounding up: float noise, never a request."""


def want(
    policy: PoolPolicy, demand: Mapping[str, float], current: Mapping[str, int]
) -> dict[str, int]:
    """The workers each pool of ``policy`` wants (sorted by taint) for ``demand``, its
    requests in flight (0 when missing). ``current`` is the want each pool was recommended
    last (``Window.latest``; empty on a fresh start), against which the tolerance is
    measured. Not the workers it is allotted: when the wants do not fit, a pool holds
    fewer than it wants, a demand near that smaller size would want only it, the next
    allotment shrinks it further, and the pools flap."""
    return {
        pool: max(
            _elastic_want(policy.elastic, pool, demand.get(pool, 0), current.get(pool, 0)),
            policy.min_per_pool,
        )
        for pool in sorted(policy.pools)
    }


def _elastic_want(elastic: Elastic | None, pool: str, demand: float, current: int) -> int:
    """``ceil(demand / target)``, or ``current`` within the tolerance; 0 when not elastic
    (the minimum then decides)."""
    target = None if elastic is None else elastic.target(pool)
    if elastic is None or target is None:
        return 0
    workers = exact_decimal(demand) / exact_decimal(target)
    band = current * exact_decimal(elastic.tolerance)
    if current > 0 and abs(workers - current) <= band + NOISE:
        return current
    return max(math.ceil(workers - NOISE), 0)


def allot(n: int, policy: PoolPolicy, wants: Mapping[str, int]) -> dict[str, int]:
    """``n`` routable workers over the pools of ``policy`` for ``wants`` (sorted by taint;
    the counts sum to ``n``). A want of ``min_per_pool`` or less, or none, counts as
    ``min(min_per_pool, n // pools)``: all of the minimum the fleet allows, which the plain
    split guarantees anyway, so a fleet too small for every minimum still gets the plain
    split when nothing is in demand."""
    floor = min(policy.min_per_pool, n // len(policy.pools))
    asked = {pool: wants.get(pool, 0) for pool in sorted(policy.pools)}
    wanted = {pool: w if w > policy.min_per_pool else floor for pool, w in asked.items()}
    if sum(wanted.values()) > n:
        return apportion(n, wanted, minimum=policy.min_per_pool)
    return _fitting(n, policy, wanted)


def _fitting(n: int, policy: PoolPolicy, wanted: Mapping[str, int]) -> dict[str, int]:
    """Wants that fit: the weighted split, with each pool short of its want held at it and
    the rest split again by weight over the others, until none is short. Some pool is
    never short (the others' wants leave it at least its own), so this ends."""
    held: dict[str, int] = {}
    while True:
        free = {pool: weight for pool, weight in policy.pools.items() if pool not in held}
        counts = apportion(n - sum(held.values()), free, minimum=policy.min_per_pool)
        short = {pool: wanted[pool] for pool, count in counts.items() if count < wanted[pool]}
        if not short:
            return dict(sorted({**counts, **held}.items()))
        held.update(short)


Recommendation = tuple[float, int]
"""(seconds of the caller's clock, want): a want, and the last time it was in force."""


@dataclass(frozen=True)
class Window:
    """The hysteresis: each pool's recent wants, so a lower one takes effect only once it
    has lasted ``scale_down_after`` seconds.

    A want is in force from the ``settle`` that recommends it to the next one. ``wants``
    maps a pool to its recommendations, oldest first, each with the last time it was in
    force, kept as a decreasing-max queue: every want is larger than all later ones (a
    want is dropped as soon as a newer one is as large: it can never be the maximum
    again), so the first is the effective want, and a pool keeps at most one entry per
    distinct want still in the window.
    """

    wants: Mapping[str, tuple[Recommendation, ...]] = field(
        default_factory=lambda: MappingProxyType({}), hash=False
    )

    def settle(
        self, raw: Mapping[str, int], now: float, scale_down_after: float
    ) -> tuple[dict[str, int], Window]:
        """The effective want of each pool of ``raw``, the largest in force within the last
        ``scale_down_after`` seconds (``raw`` is in force now), and the window that goes
        on. ``now`` is wall-clock seconds, so a leader that loads the window continues it;
        a time later than ``now`` (a clock stepped back) counts as now. Pools not in
        ``raw`` are dropped."""
        settled: dict[str, int] = {}
        kept: dict[str, tuple[Recommendation, ...]] = {}
        for pool in sorted(raw):
            queue = _push(self.wants.get(pool, ()), now, raw[pool], now - scale_down_after)
            settled[pool], kept[pool] = queue[0][1], queue
        return settled, Window(MappingProxyType(kept))

    @property
    def latest(self) -> dict[str, int]:
        """The want each pool was recommended last: ``want``'s ``current``."""
        return {pool: queue[-1][1] for pool, queue in self.wants.items() if queue}

    def to_json(self) -> dict[str, list[list[float | int]]]:
        """The window as JSON: pool -> [[time, want], ...], oldest first."""
        return {pool: [[when, was] for when, was in queue] for pool, queue in self.wants.items()}

    @classmethod
    def from_json(cls, obj: object) -> Window:
        """A window from ``to_json``'s form; ``TypeError`` or ``ValueError`` naming what is
        wrong when it is not one (the caller then starts with an empty window)."""
        if not isinstance(obj, Mapping):
            raise TypeError(
                f"window: must be a mapping of pool to [[time, want], ...], got {brief(obj)}"
            )
        queues = {_pool_of(pool): _queue_of(pool, queue) for pool, queue in obj.items()}
        return cls(MappingProxyType(dict(sorted(queues.items()))))


def _push(
    queue: tuple[Recommendation, ...], now: float, wanted: int, since: float
) -> tuple[Recommendation, ...]:
    """``queue`` with ``wanted`` recommended at ``now``. The want recommended last was in
    force until now, so its time becomes now; the wants ``wanted`` matches or beats go
    (they can never be the maximum again), and so do those last in force at ``since`` or
    before. The latest is always kept."""
    entries = [(min(when, now), was) for when, was in queue]
    if entries:
        entries[-1] = (now, entries[-1][1])
    entries = [entry for entry in entries if entry[1] > wanted]
    entries.append((now, wanted))
    while len(entries) > 1 and entries[0][0] <= since:
        del entries[0]
    return tuple(entries)


def _pool_of(pool: object) -> str:
    if not isinstance(pool, str):
        raise TypeError(f"window: pool {brief(pool, 100)} must be a string")
    return pool


def _queue_of(pool: str, queue: object) -> tuple[Recommendation, ...]:
    if not isinstance(queue, list | tuple):
        raise TypeError(
            f"window: {brief(pool, 100)} must be a list of [time, want], got {brief(queue)}"
        )
    entries = tuple(_recommendation_of(pool, entry) for entry in queue)
    for (before, larger), (after, smaller) in itertools.pairwise(entries):
        if after < before or smaller >= larger:
            raise ValueError(
                f"window: {brief(pool, 100)} must be oldest first, each want larger than every "
                f"later one, got {brief(queue)}"
            )
    return entries


def _recommendation_of(pool: str, entry: object) -> Recommendation:
    if not isinstance(entry, list | tuple) or len(entry) != 2:
        raise TypeError(
            f"window: an entry of {brief(pool, 100)} must be [time, want], got {brief(entry)}"
        )
    when, was = entry
    if isinstance(when, bool) or not isinstance(when, int | float) or not math.isfinite(when):
        raise ValueError(
            f"window: a time of {brief(pool, 100)} must be a finite number, got {brief(when)}"
        )
    if isinstance(was, bool) or not isinstance(was, int) or was < 0:
        raise ValueError(
            f"window: a want of {brief(pool, 100)} must be a whole number >= 0, got {brief(was)}"
        )
    return float(when), was
