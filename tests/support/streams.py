"""Reading event streams in tests: the next event under a deadline, and folding store
watch events into the key → value state they describe."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

from dynamod.store import Put, Resync, WatchEvent

T = TypeVar("T")


async def next_event(events: AsyncIterator[T], within: float = 10.0) -> T:
    async with asyncio.timeout(within):
        return await anext(events)


def fold(state: dict[str, bytes], event: WatchEvent) -> None:
    """Apply one watch event to a key → value map."""
    if isinstance(event, Resync):
        state.clear()
        state.update({e.key: e.value for e in event.entries})
    elif isinstance(event, Put):
        state[event.key] = event.entry.value
    else:
        state.pop(event.key, None)
