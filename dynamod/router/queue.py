"""The pending queue: requests waiting for a worker, first come first served, per model.

A ``Waiter`` is one parked request: its future is resolved by whoever finds it a worker
(the router, inside ``apply`` or ``release``), or failed with the reason it gives up. The
waiting coroutine owns the deadline (an ``asyncio.Timeout``); the router moves that
deadline when the waiter's situation changes (all eligible workers busy ↔ no eligible
worker at all). Nothing here runs on its own: no task, no timer besides the owner's
``asyncio.timeout``, so nothing can outlive the router.

Order: waiters of one model are offered workers in arrival order, so an earlier request
always gets the first pick of a freed worker. Requests of different models never compete.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dynamod.router.config import RouterConfig

if TYPE_CHECKING:
    from dynamod.router.types import Assignment, RouteRequest


class WaitState(enum.Enum):
    """What a waiting request is waiting for."""

    BUSY = "busy"
    """Eligible workers exist and every one is over a busy threshold."""
    NO_WORKER = "no_worker"
    """No worker satisfies the request's constraints at all."""


@dataclass(eq=False)
class Waiter:
    """One parked request. ``enqueued`` is in event-loop time (``loop.time()``)."""

    request: RouteRequest
    state: WaitState
    enqueued: float
    future: asyncio.Future[Assignment]
    timeout: asyncio.Timeout | None = field(default=None, repr=False)

    @property
    def model(self) -> str:
        return self.request.model

    @property
    def pending(self) -> bool:
        """Still waiting: neither dispatched, failed nor cancelled."""
        return not self.future.done()

    def deadline(self, config: RouterConfig) -> float | None:
        """When the wait ends, in loop time; counted from arrival, whatever the state."""
        wait = self.request.max_wait
        if wait is None:
            wait = config.max_queue_wait if self.state is WaitState.BUSY else config.no_worker_wait
        return None if wait is None else self.enqueued + wait

    def move_deadline(self, config: RouterConfig) -> None:
        """Re-arm the owner's timeout after ``state`` changed."""
        if self.timeout is not None and not self.timeout.expired():
            self.timeout.reschedule(self.deadline(config))


class PendingQueue:
    """Waiters by model in arrival order, with a capacity over all models.

    ``on_depth(model, depth)`` is called after every change of a model's depth (metrics).
    """

    def __init__(self, capacity: int, on_depth: Callable[[str, int], None]) -> None:
        self.capacity = capacity
        self._on_depth = on_depth
        self._by_model: dict[str, dict[int, Waiter]] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Waiter]:
        """Every waiter, model by model, each model in arrival order (a snapshot)."""
        return iter([w for waiters in self._by_model.values() for w in waiters.values()])

    @property
    def full(self) -> bool:
        return self._size >= self.capacity

    def depth(self, model: str) -> int:
        return len(self._by_model.get(model, ()))

    def waiting(self, model: str) -> list[Waiter]:
        """The waiters of ``model`` in arrival order (a snapshot: safe to change meanwhile)."""
        return list(self._by_model.get(model, {}).values())

    def push(self, waiter: Waiter) -> None:
        """Add at the back. The caller checks ``full`` first (it knows what to say)."""
        assert not self.full, "PendingQueue.push on a full queue"
        waiters = self._by_model.setdefault(waiter.model, {})
        waiters[id(waiter)] = waiter
        self._size += 1
        self._on_depth(waiter.model, len(waiters))

    def remove(self, waiter: Waiter) -> bool:
        """Take ``waiter`` out; ``False`` if it was not there (already dispatched)."""
        waiters = self._by_model.get(waiter.model)
        if waiters is None or waiters.pop(id(waiter), None) is None:
            return False
        self._size -= 1
        if not waiters:
            del self._by_model[waiter.model]
        self._on_depth(waiter.model, len(waiters))
        return True
