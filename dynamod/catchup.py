"""A bounded queue whose reader may fall behind: the one mechanism under every "subscribe
and follow" stream (a store watch, the worker view's subscriptions, the pool events').

The writer never waits. When the reader is too slow, the writer's side calls
``fall_behind`` and the queue holds a gap where the dropped items were; when the reader
reaches the gap it gets one *catch-up* item in their place, built by the subclass's
``catch_up`` (a store watch lists the store again, a view subscription takes the view's
snapshot, a pool subscription says how many events it missed). Items queued after a gap
come after the catch-up, so the reader sees everything in order; a second overflow next
to a gap widens it instead of adding another.
"""

from __future__ import annotations

import abc
import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Self, TypeVar

T = TypeVar("T")


@dataclass
class _Gap:
    """Where dropped items were: ``missed`` of them, or more (a cleared queue counts 1)."""

    missed: int


class CatchUpQueue(abc.ABC, Generic[T]):
    """One reader's items, as an async iterator: at most ``maxsize`` items (and, with
    ``maxbytes``, their sizes in bytes), a gap for what did not fit (see the module
    docstring)."""

    def __init__(self, maxsize: int, maxbytes: int | None = None) -> None:
        self._maxsize = maxsize
        self._maxbytes = maxbytes
        self._items: deque[tuple[T, int] | _Gap] = deque()
        self._wakeup = asyncio.Event()
        self._closed = False
        self.queued_bytes = 0

    @abc.abstractmethod
    async def catch_up(self, missed: int) -> T:
        """The item the reader gets in place of ``missed`` dropped ones."""

    @property
    def behind(self) -> bool:
        """A gap is the last thing queued: the catch-up to come covers what is pushed now."""
        return bool(self._items) and isinstance(self._items[-1], _Gap)

    def fits(self, size: int = 0) -> bool:
        if len(self._items) >= self._maxsize:
            return False
        return self._maxbytes is None or self.queued_bytes + size <= self._maxbytes

    def put(self, item: T, size: int = 0) -> None:
        """Queue ``item`` (the caller checked ``fits``)."""
        self._items.append((item, size))
        self.queued_bytes += size
        self._wakeup.set()

    def fall_behind(self, *, drop_queued: bool = False) -> None:
        """Mark a gap after what is queued (``drop_queued``: in place of it, for a catch-up
        that stands for the whole state, such as a snapshot)."""
        if drop_queued:
            self._items.clear()
            self.queued_bytes = 0
        if self.behind:
            gap = self._items[-1]
            assert isinstance(gap, _Gap)
            gap.missed += 1
        else:
            self._items.append(_Gap(1))
        self._wakeup.set()

    def drop_queued_if(self, covered: Callable[[T], bool]) -> None:
        """Drop the queued items for which ``covered(item)`` is true (a catch-up that
        already holds them), keeping any gap."""
        self._items = deque(
            entry for entry in self._items if isinstance(entry, _Gap) or not covered(entry[0])
        )
        self.queued_bytes = sum(entry[1] for entry in self._items if not isinstance(entry, _Gap))

    def close(self) -> None:
        self._closed = True
        self._wakeup.set()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> T:
        while not self._closed:
            if self._items:
                entry = self._items.popleft()
                if isinstance(entry, _Gap):
                    return await self.catch_up(entry.missed)
                item, size = entry
                self.queued_bytes -= size
                return item
            self._wakeup.clear()
            await self._wakeup.wait()
        raise StopAsyncIteration
