"""``eventually``: wait for a sampled signal under a deadline.

For what cannot be waited on as an event — a status read over an API, a metric, a file
another process writes — sample it until it is accepted or the deadline passes; the
failure shows the last sample. Anything that can be awaited as an event should be."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    sample: Callable[[], Awaitable[T]],
    accept: Callable[[T], bool],
    *,
    within: float = 10.0,
    every: float = 0.05,
    what: str = "the condition",
) -> T:
    """The first sample ``accept`` takes, within ``within`` seconds."""
    last: list[T] = []
    try:
        async with asyncio.timeout(within):
            while True:
                value = await sample()
                last[:] = [value]
                if accept(value):
                    return value
                await asyncio.sleep(every)
    except TimeoutError:
        seen = repr(last[0])[:2000] if last else "no sample"
        raise AssertionError(f"{what} did not hold within {within:g} s; last: {seen}") from None
