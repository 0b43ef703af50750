"""The pending queue: requests waiting for a worker, first come first served, per model.

A ``Waiter`` is one parked request: its future is resolved by whoever finds it a worker
(the router, inside ``apply`` or ``release``), or failed with the reason it gives up. The
waiting coroutine owns the deadline (an ``asyncio.Timeout``); the router moves that
deadline when the waiter's situation changes (all eligible workers busy ↔ no eligible
worker at all). Nothing here runs on its own: no task, no timer besides the owner's
``asyncio.timeout``, so nothing can outlive the router.

Waiters that ask for the same thing — one model, the same required taints, the same
excluded workers, the same needs of a card (``fit.CardNeeds``: a reading and a context
tier, so requests of any length that fit the same workers agree) — form a ``Case``: they
can use exactly the same workers, so one look at the fleet answers for all of them, and
they are always in the same ``WaitState``. Re-checking the queue therefore costs one look
per case, not one per waiter.

Order: waiters of one model are offered workers in arrival order (``Waiter.seq``, merged
across cases by ``by_arrival``), so an earlier request always gets the first pick of a
freed worker. Requests of different models never compete.
"""

from __future__ import annotations

import asyncio
import enum
import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dynamod.router.fit import CardNeeds
from dynamod.router.knobs import RouterKnobs

if TYPE_CHECKING:
    from dynamod.router.types import Assignment, RouteRequest

CaseKey = tuple[frozenset[str], frozenset[str], CardNeeds]
"""(required taints, excluded worker keys, needs of a card): what decides the workers a
waiter may use."""


class WaitState(enum.Enum):
    """What a waiting request is waiting for."""

    BUSY = "busy"
    """Eligible workers exist and every one is over a busy threshold."""
    NO_WORKER = "no_worker"
    """No worker satisfies the request's constraints at all."""


@dataclass(eq=False)
class Waiter:
    """One parked request. ``enqueued`` and ``settle_until`` are in event-loop time
    (``loop.time()``); ``seq`` is its place in arrival order."""

    request: RouteRequest
    state: WaitState
    enqueued: float
    future: asyncio.Future[Assignment]
    seq: int = 0
    settle_until: float | None = None
    """Set when the waiter's last eligible worker went away while it waited: it may keep
    waiting until then for another worker to qualify (``RouterKnobs.settle_window``)."""
    timeout: asyncio.Timeout | None = field(default=None, repr=False)

    @property
    def model(self) -> str:
        return self.request.model

    @property
    def case(self) -> CaseKey:
        request = self.request
        return (request.constraints.required_taints, frozenset(request.exclude), request.needs)

    @property
    def pending(self) -> bool:
        """Still waiting: neither dispatched, failed nor cancelled."""
        return not self.future.done()

    def deadline(self, knobs: RouterKnobs) -> float | None:
        """When the wait ends, in loop time; counted from arrival, whatever the state.

        A request's ``max_wait`` is its limit in every state. Otherwise a busy wait ends
        after ``max_queue_wait``, a wait for any worker after ``no_worker_wait``, or, for a
        waiter whose eligible workers all went away, at the end of its settle window when
        that is later — but never later than its busy wait would have ended."""
        if self.request.max_wait is not None:
            return self.enqueued + self.request.max_wait
        busy = None if knobs.max_queue_wait is None else self.enqueued + knobs.max_queue_wait
        if self.state is WaitState.BUSY:
            return busy
        limit = self.enqueued + knobs.no_worker_wait
        if self.settling(knobs):
            assert self.settle_until is not None
            limit = self.settle_until if busy is None else max(limit, min(busy, self.settle_until))
        return limit

    def settling(self, knobs: RouterKnobs) -> bool:
        """Whether the settle window, not the no-worker limit, sets this waiter's deadline."""
        return (
            self.state is WaitState.NO_WORKER
            and self.request.max_wait is None
            and self.settle_until is not None
            and self.settle_until > self.enqueued + knobs.no_worker_wait
        )

    def move_deadline(self, knobs: RouterKnobs) -> None:
        """Re-arm the owner's timeout after ``state`` changed."""
        if self.timeout is not None and not self.timeout.expired():
            self.timeout.reschedule(self.deadline(knobs))


class Case:
    """The waiters of one model with the same ``CaseKey``, in arrival order."""

    __slots__ = ("exclude", "model", "needs", "required", "state", "waiters")

    def __init__(self, model: str, key: CaseKey, state: WaitState) -> None:
        self.model = model
        self.required, self.exclude, self.needs = key
        self.state = state
        self.waiters: dict[int, Waiter] = {}

    def __len__(self) -> int:
        return len(self.waiters)

    def head(self) -> Waiter:
        return next(iter(self.waiters.values()))


def by_arrival(cases: Iterable[Case]) -> list[tuple[int, int, Case]]:
    """A heap of ``(seq of the case's first waiter, tie-break, case)``: pop it to serve the
    cases in arrival order; push a case back with its next waiter's seq."""
    heap = [(case.head().seq, id(case), case) for case in cases if case.waiters]
    heapq.heapify(heap)
    return heap


class PendingQueue:
    """Waiters by model and case, in arrival order, with a capacity over all models.

    ``on_depth(model, depth)`` is called after every change of a model's depth (metrics).
    """

    def __init__(self, capacity: int, on_depth: Callable[[str, int], None]) -> None:
        self.capacity = capacity
        self._on_depth = on_depth
        self._by_model: dict[str, dict[CaseKey, Case]] = {}
        self._depth: dict[str, int] = {}
        self._size = 0
        self._seq = itertools.count()

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Waiter]:
        """Every waiter, model by model, each model in arrival order (a snapshot)."""
        return iter([w for model in list(self._by_model) for w in self.waiting(model)])

    @property
    def full(self) -> bool:
        return self._size >= self.capacity

    def depth(self, model: str) -> int:
        return self._depth.get(model, 0)

    def cases(self, model: str) -> list[Case]:
        """The cases of ``model`` (a snapshot: safe to change the queue meanwhile)."""
        return list(self._by_model.get(model, {}).values())

    def required(self) -> dict[frozenset[str], int]:
        """Waiters by the taints they require, over every model."""
        counts: dict[frozenset[str], int] = {}
        for cases in self._by_model.values():
            for case in cases.values():
                counts[case.required] = counts.get(case.required, 0) + len(case)
        return counts

    def waiting(self, model: str) -> list[Waiter]:
        """The waiters of ``model`` in arrival order (a snapshot)."""
        waiters = [w for case in self.cases(model) for w in case.waiters.values()]
        return sorted(waiters, key=lambda w: w.seq)

    def push(self, waiter: Waiter) -> Case:
        """Add at the back of its case; return the case. The caller checks ``full`` first
        (it knows what to say)."""
        assert not self.full, "PendingQueue.push on a full queue"
        cases = self._by_model.setdefault(waiter.model, {})
        key = waiter.case
        case = cases.get(key)
        if case is None:
            case = cases[key] = Case(waiter.model, key, waiter.state)
        waiter.seq = next(self._seq)
        case.waiters[id(waiter)] = waiter
        self._counted(waiter.model, +1)
        return case

    def remove(self, waiter: Waiter) -> bool:
        """Take ``waiter`` out; ``False`` if it was not there (already dispatched)."""
        cases = self._by_model.get(waiter.model)
        case = cases.get(waiter.case) if cases is not None else None
        if case is None or case.waiters.pop(id(waiter), None) is None:
            return False
        if not case.waiters:
            assert cases is not None
            del cases[waiter.case]
            if not cases:
                del self._by_model[waiter.model]
        self._counted(waiter.model, -1)
        return True

    def _counted(self, model: str, change: int) -> None:
        self._size += change
        depth = self._depth.get(model, 0) + change
        if depth:
            self._depth[model] = depth
        else:
            del self._depth[model]
        self._on_depth(model, depth)
