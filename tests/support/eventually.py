"""The one way a test waits for something it can only sample: ``eventually``.

Most waits in this suite are on events (a watch, a condition, a process's output). Some
things have no event a test can await: another process's listing, a daemon's metrics page,
a process's state in ``/proc``. Those are sampled, and a sampled signal is held until it is
seen: ``eventually(probe, accept)`` calls ``probe`` every ``every`` seconds until it
returns something ``accept`` takes (anything truthy, by default), and returns that; past
``within`` seconds it fails with ``what`` and the last value the probe gave. It never
asserts how long anything took (the machines are shared and noisy): ``within`` is a
deadline for a hang, not a measure.

``eventually_blocking`` is the same for synchronous tests (hypothesis, threads).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

WITHIN = 60.0
EVERY = 0.1


@overload
async def eventually(
    probe: Callable[[], Awaitable[T | None]],
    *,
    within: float = ...,
    every: float = ...,
    what: str = ...,
) -> T: ...


@overload
async def eventually(
    probe: Callable[[], Awaitable[T]],
    accept: Callable[[T], object],
    *,
    within: float = ...,
    every: float = ...,
    what: str = ...,
) -> T: ...


async def eventually(
    probe: Callable[[], Awaitable[Any]],
    accept: Callable[[Any], object] = bool,
    *,
    within: float = WITHIN,
    every: float = EVERY,
    what: str = "",
) -> Any:
    """``await probe()``'s first value that ``accept`` takes."""
    last: list[object] = []
    try:
        async with asyncio.timeout(within):
            while not accept(value := await probe()):
                last[:] = [value]
                await asyncio.sleep(every)  # sampling another process: nothing to await
            return value
    except TimeoutError:
        raise AssertionError(
            _never(what or _name(probe), within, last[0] if last else None)
        ) from None


def eventually_blocking(
    probe: Callable[[], T | None],
    *,
    within: float = WITHIN,
    every: float = EVERY,
    what: str = "",
) -> T:
    """``eventually`` for synchronous code."""
    deadline = time.monotonic() + within
    while not (found := probe()):
        if time.monotonic() > deadline:
            raise AssertionError(_never(what or _name(probe), within, found))
        time.sleep(every)
    return found


def _name(probe: Callable[..., object]) -> str:
    return getattr(probe, "__name__", repr(probe))


def _never(what: str, within: float, last: object) -> str:
    return f"{what} did not hold within {within:g} s; last seen: {last!r}"[:4000]
