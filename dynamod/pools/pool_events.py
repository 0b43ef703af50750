"""Pool events as this daemon learns them, for ``events tail``: a bounded history and
subscriptions, beside the worker view's own.

Every pool event carries the store revision it reflects: a policy's put or delete
(APPLIED, CHANGED, PAUSED, RESUMED, REMOVED), the worker record's revision a move wrote
(MOVED) or a drift changed (DRIFT), the leader key's creation (LEADER: its epoch). So a
tail from revision R replays the pool events after R with the worker events after R, and
a consumer can order the merged stream by revision. Every daemon learns the same events
from the store (policies and the leader key from their keys, moves and drift from the
leader's history), so a tail shows them whichever daemon it asks.

A subscription's queue is bounded; one that falls behind is told so with one LOST event
(how many it missed) instead of blocking anyone.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from dynamod.catchup import CatchUpQueue
from dynamod.pool_results import PoolEventInfo

HISTORY: Final = 2000
QUEUE: Final = 1024


@dataclass(frozen=True)
class PoolEvent:
    """One pool event, the store revision it reflects, when this daemon learned it."""

    info: PoolEventInfo
    revision: int
    seen: float = field(default_factory=time.time, compare=False)


class PoolSubscription(CatchUpQueue[PoolEvent]):
    """One consumer's pool events, as an async iterator: what did not fit comes as one
    LOST event in its place (``dynamod.catchup``)."""

    def push(self, event: PoolEvent) -> None:
        if self.fits():
            self.put(event)
        else:
            self.fall_behind()

    async def catch_up(self, missed: int) -> PoolEvent:
        message = f"this stream fell behind: {missed} pool events were dropped"
        return PoolEvent(PoolEventInfo("LOST", "", message=message), 0)


class PoolEvents:
    """The history and the subscriptions (see the module docstring)."""

    def __init__(self, history: int = HISTORY) -> None:
        self._history: deque[PoolEvent] = deque(maxlen=history)
        self._subscriptions: set[PoolSubscription] = set()

    def publish(self, info: PoolEventInfo, revision: int) -> None:
        event = PoolEvent(info, revision)
        self._history.append(event)
        for subscription in self._subscriptions:
            subscription.push(event)

    def backlog(self, since: int | None) -> list[PoolEvent]:
        """The events kept with a revision after ``since`` (none when ``since`` is None)."""
        if since is None:
            return []
        return [e for e in self._history if e.revision > since]

    @contextlib.contextmanager
    def subscribe(
        self, *, since: int | None = None, maxsize: int = QUEUE
    ) -> Iterator[PoolSubscription]:
        """Events from now, after the kept ones past ``since``."""
        subscription = PoolSubscription(maxsize)
        for event in self.backlog(since):
            subscription.push(event)
        self._subscriptions.add(subscription)
        try:
            yield subscription
        finally:
            subscription.close()
            self._subscriptions.discard(subscription)

    def close(self) -> None:
        """End every subscription (the daemon is stopping)."""
        for subscription in list(self._subscriptions):
            subscription.close()
