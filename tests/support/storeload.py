"""Load on a store for fault tests: a writer that counts what the store took and refused,
and a follower that folds a watch into the state it describes, checking that no change
comes twice or out of order. Both are advanced by a task; ``until`` waits on them."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import TypeVar

from dynamod.errors import StoreUnavailableError
from dynamod.store import Resync, Store, Watch, WatchEvent
from tests.support.streams import fold

RECOVERY = 30.0  # how long a store may take to come back after a fault; not a latency claim
RETRY = 0.1

T = TypeVar("T")


async def answered(call: Callable[[], Awaitable[T]], within: float = RECOVERY) -> T:
    """``call()``, again after each ``StoreUnavailableError`` (which the contract says may
    be retried), until it answers or ``within`` seconds have passed."""
    async with asyncio.timeout(within):
        while True:
            try:
                return await call()
            except StoreUnavailableError:
                await asyncio.sleep(RETRY)


class _Progress:
    """Counters another task advances; ``until`` waits for a condition on them."""

    def __init__(self) -> None:
        self._changed = asyncio.Condition()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def until(self, condition: Callable[[], bool], within: float = RECOVERY) -> None:
        async with asyncio.timeout(within), self._changed:
            await self._changed.wait_for(condition)


class Writer(_Progress):
    """Writes ``w/0`` .. ``w/4`` round and round with rising numbers, counting what the store
    took and refused, and keeping the last number acknowledged for each key."""

    def __init__(self, store: Store, keys: int = 5) -> None:
        super().__init__()
        self.store = store
        self.keys = keys
        self.accepted = 0
        self.refused = 0
        self.acked: dict[str, int] = {}

    async def run(self) -> None:
        for i in itertools.count():
            key = f"w/{i % self.keys}"
            try:
                await self.store.put(key, b"%d" % i)
                self.accepted += 1
                self.acked[key] = i
            except StoreUnavailableError:
                self.refused += 1
                await asyncio.sleep(0.02)  # the store is away: pace the attempts, not a poll
            await self._notify()

    def lost(self, state: dict[str, bytes]) -> list[str]:
        """Keys whose acknowledged number is missing from ``state``: a later write whose
        outcome was unknown may have landed, an older one never."""
        return [
            f"{key}: acknowledged {number}, found {state.get(key)!r}"
            for key, number in sorted(self.acked.items())
            if key not in state or int(state[key]) < number
        ]


class Follower(_Progress):
    """Folds a watch into a key → value map, as a consumer of discovery would."""

    def __init__(self, watch: Watch) -> None:
        super().__init__()
        self.watch = watch
        self.state: dict[str, bytes] = {}
        self.resyncs = 0
        self.seen = 0

    async def run(self) -> None:
        async for event in self.watch:
            self._apply(event)
            await self._notify()

    def _apply(self, event: WatchEvent) -> None:
        if not isinstance(event, Resync):
            assert event.revision > self.seen, f"{event} repeats or reorders a change"
        fold(self.state, event)
        self.resyncs += isinstance(event, Resync)
        self.seen = max(self.seen, event.revision)
