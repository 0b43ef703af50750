"""What the front's answers cost, per worker and in all: ``Traffic``.

The front calls ``Traffic.answered(key, seconds)`` once per request whose answer began
(its first byte from the worker ``key``, ``seconds`` after the request arrived). That is
one ``bisect`` over ``BOUNDS`` and four integer increments: no lock (the event loop's
thread is the only writer), no allocation, no dictionary entry made on the request's path.
A worker's ``FirstBytes`` is made when the worker view adds it and dropped when it leaves
(``apply``, a view listener), so an answer from a worker that just left is counted in all
and nowhere else, and the map never outgrows the view.

The counts only ever grow; whoever wants a rate or a quantile over an interval keeps the
counts it saw last and subtracts (``stats_sampler.py`` does, once a second while someone
watches). ``quantile`` estimates one from such a difference, as Prometheus's
``histogram_quantile`` does: linearly inside the bucket it falls in.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from dynamod.discovery_events import DiscoveryEvent, ViewResync, WorkerAdded, WorkerRemoved

BOUNDS: tuple[float, ...] = tuple(0.001 * 1.5**i for i in range(30))
"""Upper bounds of the first-byte buckets, in seconds: 1 ms to 127 s, each 1.5 times the
last (a quantile is then known to within a quarter or so); a last bucket holds the rest."""


class FirstBytes:
    """Answers begun and their first-byte times, in ``BOUNDS`` buckets (``counts`` has one
    more, for anything slower); ``total`` is their sum."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BOUNDS) + 1)
        self.total = 0


class Traffic:
    """Answers per worker (by store key) and in all; see the module docstring."""

    def __init__(self) -> None:
        self.fleet = FirstBytes()
        self._workers: dict[str, FirstBytes] = {}

    def answered(self, key: str, seconds: float) -> None:
        """An answer of the worker ``key`` began ``seconds`` after its request arrived."""
        index = bisect_left(BOUNDS, seconds)
        fleet = self.fleet
        fleet.counts[index] += 1
        fleet.total += 1
        worker = self._workers.get(key)
        if worker is not None:
            worker.counts[index] += 1
            worker.total += 1

    def get(self, key: str) -> FirstBytes | None:
        return self._workers.get(key)

    def items(self) -> Iterator[tuple[str, FirstBytes]]:
        return iter(self._workers.items())

    def __len__(self) -> int:
        return len(self._workers)

    def apply(self, event: DiscoveryEvent) -> None:
        """A view listener: a worker's counts start when it is added and end when it goes."""
        if isinstance(event, ViewResync):
            now = {record.key for record in event.records}
            for key in set(self._workers) - now:
                del self._workers[key]
            for key in now:
                self._workers.setdefault(key, FirstBytes())
        elif isinstance(event, WorkerAdded):
            self._workers.setdefault(event.record.key, FirstBytes())
        elif isinstance(event, WorkerRemoved):
            self._workers.pop(event.record.key, None)


def quantile(q: float, counts: Sequence[float], bounds: Sequence[float] = BOUNDS) -> float | None:
    """The ``q`` quantile (0..1) of what was counted per bucket of ``bounds`` (a
    difference of two ``FirstBytes.counts``; ``counts`` has one more, past the last
    bound); None when nothing was. Inside a bucket the values are taken as spread evenly;
    one past the last bound counts as that bound."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0.0
    for index, count in enumerate(counts):
        if count and seen + count >= rank:
            if index == len(bounds):
                return bounds[-1]
            low = bounds[index - 1] if index else 0.0
            return low + (bounds[index] - low) * max(0.0, rank - seen) / count
        seen += count
    return bounds[-1]
