"""The stats stream's daemon side (``dynamoctl top``): ``StatsSampler``.

``StatsSampler.run()`` is one task of the daemon's task group. While nobody watches it
waits on an event and costs nothing. While a watch is open (``watch()``) it samples once
every ``interval`` seconds (1 by default): the answers each worker began since the last
sample, and their first-byte times (``traffic.Traffic``, counted by the front), the same
in all, and the watch lag of this daemon's own taint writes
(``dynamod_taint_propagation_seconds``). A sample is the difference between two readings
of counters that only grow, so a rate is exact over its interval and nothing is counted
twice; the first sample after an idle spell is only the baseline.

While watched it also keeps each worker's figures (its state, what is in flight there,
what its engine reports) in a map of its own, brought up to date only for the workers
that changed: those the router's ``watch`` names (a load or a report changed: a set
insert on the router's path, and only while watched) and those the view's events name.
Each watch turns every sample into one frame for its own query (``StatsQuery``): the
workers its selector matches, counted by state, sorted, and only the rows it asked for
built and sent — so a frame of a 10,000-worker fleet is one pass over that map and a
bounded selection (``heapq``), and carries as many rows as fit the watcher's screen. A
watch's first frame is sent at once, from the latest sample (none: no figures yet). A
slow watcher skips samples rather than queueing them: it always gets the newest.

``close()`` (the daemon's drain) ends every watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Histogram

from dynamod.boundary.breaches import Breaches
from dynamod.discovery.view import WorkerView
from dynamod.discovery_events import DiscoveryEvent, ViewResync, WorkerAdded, WorkerRemoved
from dynamod.engine_events import EngineLoad
from dynamod.load import Load
from dynamod.pools.reconciler import PoolReconciler
from dynamod.records import WorkerRecord
from dynamod.results import WorkerState, id_prefix_length, worker_state
from dynamod.router import Router
from dynamod.selectors import Selector, parse
from dynamod.stats_results import FleetStats, PoolStats, StatsQuery, WorkerStats
from dynamod.traffic import FirstBytes, Traffic, quantile

INTERVAL = 1.0
"""Seconds between two samples while someone watches."""
MARK_LENGTH = 200
"""The most characters of a boundary mark a row carries."""


@dataclass(frozen=True)
class Rate:
    """Answers per second over an interval, and their first-byte quantiles."""

    rps: float = 0.0
    p50: float | None = None
    p99: float | None = None


@dataclass(frozen=True)
class Sample:
    """What changed over one interval (``interval`` seconds; 0 for a baseline): each
    worker's answers (only those with any), all answers, the propagation p99."""

    interval: float
    workers: dict[str, Rate]
    fleet: Rate
    propagation_p99: float | None = None


BASELINE = Sample(0.0, {}, Rate())


class _Seen:
    """One worker's figures, kept while watched: what its order and its row need."""

    __slots__ = ("busy", "engine", "in_flight", "kv", "record", "state")

    def __init__(self, record: WorkerRecord, load: Load, engine: EngineLoad | None) -> None:
        self.record = record
        self.in_flight = in_flight = load.active_requests
        self.engine = engine
        self.state = worker_state(record.taints, load, engine)
        reported = engine.running + engine.waiting if engine is not None else 0
        self.busy = max(in_flight, reported)
        self.kv = engine.kv_usage if engine is not None else -1.0

    @property
    def id(self) -> str:
        return self.record.instance_id


Pools = Callable[[WorkerRecord], tuple[str, ...]]
Key = Callable[[_Seen], Any]


def _keys(held: Pools, marks: Callable[[str], str], rates: Mapping[str, Rate]) -> dict[str, Key]:
    """Each order of ``SORTS`` as a key that ``heapq.nsmallest`` takes (figures negated:
    the largest first)."""

    def rps(s: _Seen) -> float:
        rate = rates.get(s.record.key)
        return rate.rps if rate is not None else 0.0

    def p50(s: _Seen) -> float:
        rate = rates.get(s.record.key)
        return rate.p50 if rate is not None and rate.p50 is not None else -1.0

    return {
        "load": lambda s: (-s.busy, -s.kv, -rps(s), s.id),
        "id": lambda s: s.id,
        "model": lambda s: (s.record.model, s.id),
        "state": lambda s: (str(s.state), s.id),
        "pools": lambda s: (",".join(held(s.record)), s.id),
        "taints": lambda s: (",".join(s.record.taints), s.id),
        "inflight": lambda s: (-s.in_flight, s.id),
        "running": lambda s: (-(s.engine.running if s.engine is not None else -1), s.id),
        "waiting": lambda s: (-(s.engine.waiting if s.engine is not None else -1), s.id),
        "kv": lambda s: (-s.kv, s.id),
        "rps": lambda s: (-rps(s), s.id),
        "p50": lambda s: (-p50(s), s.id),
        "mark": lambda s: (not marks(s.record.key), marks(s.record.key), s.id),
    }


class StatsSampler:
    """See the module docstring. ``breaches``: the boundary's marks; ``pools``: the pool
    reconciler (its plan's counts and who leads); ``propagation``: the daemon's
    propagation histogram. Each is left out of the frames when None."""

    def __init__(
        self,
        view: WorkerView,
        router: Router,
        traffic: Traffic,
        *,
        replica: str = "",
        breaches: Breaches | None = None,
        pools: PoolReconciler | None = None,
        propagation: Histogram | None = None,
        interval: float = INTERVAL,
    ) -> None:
        self.view = view
        self.router = router
        self.traffic = traffic
        self.replica = replica
        self.breaches = breaches
        self.pools = pools
        self.propagation = propagation
        self.interval = interval
        self.latest = BASELINE
        self._watches: set[StatsWatch] = set()
        self._watched = asyncio.Event()
        self._sampled = asyncio.Event()
        self._closed = False
        self._at: float | None = None
        self._seen: dict[str, tuple[int, list[int]]] = {}
        self._fleet: tuple[int, list[int]] = (0, [])
        self._lag: list[float] = []
        self._prefix: tuple[int, int, int] = (-1, -1, 8)
        self._figures: dict[str, _Seen] = {}
        self._dirty: set[str] = set()
        self._stale = True
        """Every worker's figures must be read again (watching began, or a resync)."""
        self.changes = 0
        """Bumped at every change of the view seen while watched, and at every full read:
        the id prefix is worked out again only then."""

    # The task

    async def run(self) -> None:
        """Sample while anyone watches, until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            await self._watched.wait()
            with self._following():
                self._sample(loop.time())  # the baseline
                while self._watches:
                    await asyncio.sleep(self.interval)  # a rate needs an interval
                    self._sample(loop.time())
            self._watched.clear()
            self._at = None
            self.latest = BASELINE

    @contextlib.contextmanager
    def _following(self) -> Iterator[None]:
        """Keep the workers' figures current while watched; forget them after."""
        self._stale = True
        unwatch = self.router.watch(self._dirty.add)
        unlisten = self.view.listen(self._on_event)
        try:
            yield
        finally:
            unwatch()
            unlisten()
            self._figures.clear()
            self._dirty.clear()
            self._stale = True

    def _on_event(self, event: DiscoveryEvent) -> None:
        self.changes += 1
        if isinstance(event, ViewResync | WorkerAdded | WorkerRemoved):
            # A worker come or gone may change which reading its model's workers agree on,
            # and so which of them are excluded: every figure is read again.
            self._stale = True
        else:
            self._dirty.add(event.record.key)

    def _current(self) -> dict[str, _Seen]:
        """Every worker's figures, read again where they changed."""
        figures = self._figures
        if self._stale:
            self._stale = False
            self.changes += 1
            self._dirty.clear()
            figures.clear()
            for record in self.view.records():
                figures[record.key] = self._read(record)
        for key in self._dirty:
            found = self.view.get(key)
            if found is None:
                figures.pop(key, None)
            else:
                figures[key] = self._read(found)
        self._dirty.clear()
        return figures

    def _read(self, record: WorkerRecord) -> _Seen:
        key = record.key
        seen = _Seen(record, self.router.load(key), self.router.reported(key))
        if seen.state is WorkerState.READY and self.router.disagreement(record):
            seen.state = WorkerState.EXCLUDED  # as ``Control.info`` says it
        return seen

    def close(self) -> None:
        """End every watch (the daemon drains)."""
        self._closed = True
        self._wake()

    @property
    def closed(self) -> bool:
        return self._closed

    async def sampled(self) -> None:
        """Wait for the next sample (or for ``close``)."""
        await self._sampled.wait()

    @contextlib.contextmanager
    def watch(self) -> Iterator[StatsWatch]:
        """A watch of the frames, open while the block runs."""
        watch = StatsWatch(self)
        self._watches.add(watch)
        self._watched.set()
        try:
            yield watch
        finally:
            self._watches.discard(watch)

    def _wake(self) -> None:
        self._sampled.set()
        self._sampled = asyncio.Event()

    # Sampling

    def _sample(self, now: float) -> None:
        interval = 0.0 if self._at is None else now - self._at
        self._at = now
        workers = self._workers(interval)
        fleet = self._rate(self.traffic.fleet, self._fleet, interval)
        self._fleet = (self.traffic.fleet.total, list(self.traffic.fleet.counts))
        lag = self._propagation(interval)
        self.latest = Sample(interval, workers, fleet, lag) if interval else BASELINE
        self._wake()

    def _workers(self, interval: float) -> dict[str, Rate]:
        """Each worker's rate since the last sample (only those with answers), and the
        counts kept for the next one (only those with any: most of a quiet fleet has none)."""
        rates: dict[str, Rate] = {}
        seen, kept = self._seen, {}
        for key, counts in self.traffic.items():
            if not counts.total:
                continue
            last = seen.get(key)
            if last is not None and last[0] == counts.total:
                kept[key] = last
                continue
            if interval:
                rates[key] = self._rate(counts, last or (0, []), interval)
            kept[key] = (counts.total, list(counts.counts))
        self._seen = kept
        return rates

    @staticmethod
    def _rate(counts: FirstBytes, last: tuple[int, list[int]], interval: float) -> Rate:
        if not interval or counts.total == last[0]:
            return Rate()
        before = last[1] or [0] * len(counts.counts)
        delta = [now - then for now, then in zip(counts.counts, before, strict=True)]
        return Rate(
            (counts.total - last[0]) / interval, quantile(0.5, delta), quantile(0.99, delta)
        )

    def _propagation(self, interval: float) -> float | None:
        if self.propagation is None:
            return None
        bounds, cumulative = _buckets(self.propagation)
        last, self._lag = self._lag, cumulative
        if not interval or not last:
            return None
        counts = [now - then for now, then in zip(_spread(cumulative), _spread(last), strict=True)]
        return quantile(0.99, counts, bounds)

    # Frames

    def frame(self, query: StatsQuery, matched: Sequence[_Seen], sample: Sample) -> FleetStats:
        """The frame of ``sample`` for ``query``, over the workers it ``matched``."""
        states = Counter(s.state for s in matched)
        key = _keys(self._held(), self._mark, sample.workers)[query.sort]
        rows = self._chosen(matched, key, query)
        fleet = sample.fleet
        leader, epoch = self._leader()
        figures = self._figures
        return FleetStats(
            time=time.time(), interval=sample.interval, workers=len(figures),
            matched=len(matched), states=dict(states), rps=fleet.rps,
            first_byte_p50=fleet.p50, first_byte_p99=fleet.p99,
            queue_depth=self.router.queue_depth, pools=self._pool_counts(), leader=leader,
            epoch=epoch, revision=self.view.revision, propagation_p99=sample.propagation_p99,
            rows=tuple(self._row(s, sample) for s in rows), offset=query.offset,
            id_prefix=self._id_prefix(figures), replica=self.replica,
        )  # fmt: skip

    def matching(self, selector: Selector) -> list[_Seen]:
        """The figures of the workers ``selector`` matches, current."""
        figures = self._current()
        if not selector:
            return list(figures.values())
        return [s for s in figures.values() if selector.matches(s.record)]

    @staticmethod
    def _chosen(seen: Sequence[_Seen], key: Key, query: StatsQuery) -> list[_Seen]:
        """The rows of ``query``: sorted by ``key``, ``offset`` skipped, ``limit`` kept."""
        wanted = query.offset + query.limit if query.limit else len(seen)
        pick = heapq.nlargest if query.reverse else heapq.nsmallest
        return pick(wanted, seen, key=key)[query.offset :]

    def _row(self, seen: _Seen, sample: Sample) -> WorkerStats:
        record, engine = seen.record, seen.engine
        rate = sample.workers.get(record.key)
        return WorkerStats(
            id=record.instance_id,
            model=record.model,
            state=seen.state,
            pools=self._held()(record),
            taints=record.taints,
            in_flight=seen.in_flight,
            running=engine.running if engine is not None else None,
            waiting=engine.waiting if engine is not None else None,
            kv_usage=engine.kv_usage if engine is not None else None,
            rps=rate.rps if rate is not None else 0.0,
            first_byte_p50=rate.p50 if rate is not None else None,
            mark=self._mark(record.key),
        )

    def _mark(self, key: str) -> str:
        breach = self.breaches.last(key) if self.breaches is not None else None
        return "" if breach is None else f"{breach.kind}: {breach.message}"[:MARK_LENGTH]

    def _held(self) -> Pools:
        """The pool taints a record holds, of every stored policy."""
        taints: set[str] = set()
        if self.pools is not None:
            for stored in self.pools.view.policies.values():
                taints |= stored.policy.taints
        return lambda record: tuple(t for t in record.taints if t in taints)

    def _pool_counts(self) -> tuple[PoolStats, ...]:
        """Each pool's target and actual count, as this daemon's plans published them."""
        if self.pools is None:
            return ()
        metrics = self.pools.metrics
        actual = {_policy_pool(s.labels): s.value for s in _samples(metrics.actual)}
        return tuple(
            PoolStats(policy, pool, int(target), int(actual.get((policy, pool), 0)))
            for (policy, pool), target in sorted(
                (_policy_pool(s.labels), s.value) for s in _samples(metrics.wanted)
            )
        )

    def _leader(self) -> tuple[str, int]:
        leader = self.pools.view.leader if self.pools is not None else None
        return (leader.identity, leader.epoch) if leader is not None else ("", 0)

    def _id_prefix(self, figures: Mapping[str, _Seen]) -> int:
        """The id prefix of the whole view, worked out again only when it changed."""
        changes, count, prefix = self._prefix
        if (changes, count) != (self.changes, len(figures)):
            prefix = id_prefix_length(s.record.instance_id for s in figures.values())
            self._prefix = (self.changes, len(figures), prefix)
        return prefix


class StatsWatch:
    """One stream's frames; see ``StatsSampler.watch``."""

    def __init__(self, sampler: StatsSampler) -> None:
        self._sampler = sampler

    async def frames(self, query: StatsQuery) -> AsyncIterator[FleetStats]:
        """A frame at once, then one per sample, until the sampler closes."""
        sampler = self._sampler
        selector = parse(query.selector)
        while not sampler.closed:
            yield sampler.frame(query, sampler.matching(selector), sampler.latest)
            await sampler.sampled()


def _samples(metric: Any) -> list[Any]:
    return [s for family in metric.collect() for s in family.samples]


def _policy_pool(labels: dict[str, str]) -> tuple[str, str]:
    return labels["policy"], labels["pool"]


def _buckets(histogram: Histogram) -> tuple[tuple[float, ...], list[float]]:
    """A Prometheus histogram's finite bucket bounds and cumulative counts (+Inf last)."""
    pairs = [
        (float(s.labels["le"]), s.value) for s in _samples(histogram) if s.name.endswith("_bucket")
    ]
    bounds = tuple(le for le, _ in pairs if le != float("inf"))
    return bounds, [count for _, count in pairs]


def _spread(cumulative: list[float]) -> list[float]:
    """Cumulative counts to per-bucket ones."""
    return [now - before for now, before in zip(cumulative, [0.0, *cumulative[:-1]], strict=True)]
