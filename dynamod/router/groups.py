"""Workers grouped by what a request sees of them, and each group ordered by load.

For one request, a worker's eligibility and its preferred-taint multiplier depend only on
its model, its taints and what its card offers (its ``Reading`` and its context length:
``fit.py``); how its cost grows with its load depends on its KV block size (part of its
reading). So the workers of one model that hold the same taints, read bodies alike and
have the same context length form a ``Group``: a request may use every member or none
(its excluded keys aside), and one multiplier scales every member's cost.

Within a group a member's cost is ``multiplier * (rank + constant - reuse)`` (see
``scoring.py``): the *rank* depends only on the member's load, the constant only on the
request and the block size, and ``reuse`` only on its prefix overlap. So among members with
no overlap the lowest rank is the cheapest, whatever the request: ``LoadOrder`` keeps the
members that are not busy in rank order, and a decision looks at one member per group plus
the few workers with a prefix overlap, not at every worker.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Container, Generator

from dynamod.records import WorkerRecord
from dynamod.router.fit import ANY, CardNeeds, Reading
from dynamod.taints import OPERATOR_TAINTS

Ranked = tuple[float, int, str]
"""(rank, tie-break, key): a key's place in a ``LoadOrder``."""

# A rebuild drops the stale entries once they outnumber the live ones by this much; the
# slack keeps a small order from rebuilding on every other change.
_SLACK = 64


class LoadOrder:
    """Keys ordered by rank, lowest first; among equal ranks, the key that has held its
    rank longest comes first (so equally loaded workers take turns).

    A binary heap with lazy deletion: ``put`` and ``discard`` cost O(log n) amortized, and
    ``head`` (the lowest entry) is kept current by both, so reading it costs nothing. A
    replaced or discarded entry stays in the heap until it reaches the top or the heap is
    rebuilt, which happens when stale entries outnumber live ones: memory stays O(live).
    """

    __slots__ = ("_heap", "_live", "_ticks", "head")

    def __init__(self) -> None:
        self._heap: list[Ranked] = []
        self._live: dict[str, Ranked] = {}
        self._ticks = itertools.count()
        self.head: Ranked | None = None
        """The lowest entry, or None when the order is empty. Read it; never set it."""

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, key: object) -> bool:
        return key in self._live

    def rank(self, key: str) -> float | None:
        """The key's rank, or None when it is not in the order."""
        entry = self._live.get(key)
        return None if entry is None else entry[0]

    def put(self, key: str, rank: float) -> None:
        """Place ``key`` at ``rank`` (moving it if it was elsewhere), behind its equals."""
        entry = (rank, next(self._ticks), key)
        old = self._live.get(key)
        self._live[key] = entry
        heapq.heappush(self._heap, entry)
        head = self.head
        if head is None or entry < head:
            self.head = entry
        elif old is head:
            self.head = self._top()
        self._compact()

    def discard(self, key: str) -> None:
        old = self._live.pop(key, None)
        if old is None:
            return
        if old is self.head:
            self.head = self._top()
        self._compact()

    def first(self, skip: Container[str] = ()) -> Ranked | None:
        """The lowest entry whose key is not in ``skip``; None when there is none."""
        head = self.head
        if head is None or head[2] not in skip:
            return head
        ascending = self.ascending(skip)
        try:
            return next(ascending, None)
        finally:
            ascending.close()

    def ascending(self, skip: Container[str] = ()) -> Generator[Ranked, None, None]:
        """The live entries not in ``skip``, lowest first, computed lazily: taking ``k`` of
        them costs O(k log n). Close the iterator (or exhaust it) before changing the order:
        it restores what it took then."""
        heap, live = self._heap, self._live
        taken: list[Ranked] = []
        try:
            while heap:
                entry = heapq.heappop(heap)
                if live.get(entry[2]) is not entry:
                    continue  # stale: gone for good
                taken.append(entry)
                if entry[2] not in skip:
                    yield entry
        finally:
            for entry in taken:
                heapq.heappush(heap, entry)

    def _top(self) -> Ranked | None:
        """The lowest live entry, dropping the stale ones above it for good."""
        heap, live = self._heap, self._live
        while heap:
            top = heap[0]
            if live.get(top[2]) is top:
                return top
            heapq.heappop(heap)
        return None

    def _compact(self) -> None:
        if len(self._heap) > 2 * len(self._live) + _SLACK:
            self._heap = list(self._live.values())
            heapq.heapify(self._heap)


class Group:
    """The workers of one model with the same taints, reading and context length (module
    docstring); ``block_size`` is the reading's.

    ``members`` holds every worker of the group in arrival order; ``free`` those that are
    not busy, by rank. Whoever owns the loads keeps ``free`` current (``RoutingTable``
    places a new member with the ranker it was given).
    """

    __slots__ = (
        "block_size",
        "context_length",
        "fenced",
        "free",
        "held",
        "members",
        "model",
        "reading",
        "taints",
    )

    def __init__(
        self, model: str, taints: tuple[str, ...], reading: Reading, context_length: int
    ) -> None:
        self.model = model
        self.taints = taints
        self.held = frozenset(taints)
        self.reading = reading
        self.block_size = reading.block_size
        self.context_length = context_length
        # The operator's taints it holds (the cordon, the drain): a request must require
        # each of them to use the group.
        self.fenced = self.held & OPERATOR_TAINTS
        self.members: dict[str, WorkerRecord] = {}
        self.free = LoadOrder()

    def __repr__(self) -> str:
        return (
            f"Group({self.model!r}, {self.taints!r}, block_size={self.block_size}, "
            f"context_length={self.context_length})"
        )

    def admits(self, required: frozenset[str], needs: CardNeeds = ANY) -> bool:
        """Whether a request requiring ``required`` (and ``needs`` of a card) may use this
        group's workers: they hold every required taint, are not cordoned (or drained) unless
        the request requires the cordon (and the drain), and their card offers what it
        needs."""
        return required <= self.held and self.fenced <= required and self.suits(needs)

    def suits(self, needs: CardNeeds) -> bool:
        """Whether this group's card offers what ``needs`` asks (taints aside)."""
        return needs.admits(self.reading, self.context_length)
