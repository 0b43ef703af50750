"""Small asyncio helpers shared by the daemon, the worker and the CLI."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, Final, TypeVar

T = TypeVar("T")
R = TypeVar("R")

FAN_OUT: Final = 16
"""Workers written at once, one by one: a bulk taint update (``Control.update_taints``) and
the pool leader's moves where the store has no transactions."""


async def race(*coros: Coroutine[Any, Any, object]) -> None:
    """Run ``coros`` as tasks until the first one ends; cancel and await the others.

    The first one's exception, if it raised, propagates. Cancelling the caller cancels them
    all. This is the "whichever ends first" shape that a ``TaskGroup`` with an empty body
    gets wrong on Python 3.11: a child failing while the group waits in ``__aexit__``
    cancels the parent task and never uncancels it, so a later ``cancelling()`` check lies.
    """
    tasks = [asyncio.ensure_future(coro) for coro in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has ended.

    Its ``CancelledError`` is expected and absorbed; a cancellation of the *caller* while
    it waits still propagates (``contextlib.suppress(CancelledError)`` would swallow it).
    """
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise


async def together(*coros: Coroutine[Any, Any, object]) -> None:
    """Run ``coros`` as tasks until all have ended; the first one to fail cancels and
    awaits the others, and its exception propagates. Cancelling the caller cancels them all.

    ``race``'s twin for "all of them", for the same reason: a ``TaskGroup`` whose body has
    already ended leaves the caller cancelled on Python 3.11 when a child then fails."""
    tasks = [asyncio.ensure_future(coro) for coro in coros]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def each(items: Iterable[T], width: int, work: Callable[[T], Awaitable[R]]) -> list[R]:
    """``work(item)`` for every item, at most ``width`` at once, in the items' order as
    slots free up; the results in the items' order. The first failure cancels the rest and
    propagates (``together``)."""
    indexed = list(enumerate(items))
    results: dict[int, R] = {}
    queue = iter(indexed)

    async def slot() -> None:
        for index, item in queue:
            results[index] = await work(item)

    await together(*(slot() for _ in range(min(width, len(indexed)))))
    return [results[index] for index in range(len(indexed))]


async def wait_any(*events: asyncio.Event) -> None:
    """Return as soon as one of ``events`` is set."""
    if any(e.is_set() for e in events):
        return
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
