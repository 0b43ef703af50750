"""nats-py swallows a ``CancelledError`` that lands in its flush: the NATS store raises it
again after every call and watch step (``store/nats/store.py`` ``_cancellable``), so a
cancelled task never carries on as if nothing happened (nor retries the error a call ends
with after swallowing it), and a call made while handling an earlier cancellation (a
revoke on the way out) is not cut short."""

from __future__ import annotations

import asyncio

import pytest

from dynamod.store.nats.store import _cancellable


async def swallowing_call(inside: asyncio.Event) -> int:
    """What nats-py's flush does: the cancel lands inside it and the call returns."""
    inside.set()
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        pass
    return 1


async def test_a_swallowed_cancellation_is_raised_again() -> None:
    inside = asyncio.Event()

    async def call() -> int:
        with _cancellable():
            return await swallowing_call(inside)

    task = asyncio.create_task(call())
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_swallowed_cancellation_wins_over_the_error_the_call_then_ends_with() -> None:
    """A campaign retries a store's errors: had the error come out, the cancelled task
    would have retried it forever and its owner's exit waited forever."""
    inside = asyncio.Event()

    async def call() -> int:
        with _cancellable():
            await swallowing_call(inside)
            raise ConnectionError("the call fails after all")

    task = asyncio.create_task(call())
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_deadline_swallowed_then_an_error_is_still_the_deadline() -> None:
    inside = asyncio.Event()

    async def call() -> None:
        async with asyncio.timeout(0.01):
            with _cancellable():
                await swallowing_call(inside)
                raise ConnectionError("the call fails after all")

    with pytest.raises(TimeoutError):
        await call()


async def test_a_call_made_while_already_cancelling_runs_to_its_end() -> None:
    done: list[int] = []

    async def cleanup_after_cancel() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            with _cancellable():
                await asyncio.sleep(0)
                done.append(1)

    task = asyncio.create_task(cleanup_after_cancel())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert done == [1]
