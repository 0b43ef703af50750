"""``tasks.each``: the one bounded fan-out (a bulk taint update, the pool leader's writes)."""

from __future__ import annotations

import asyncio

import pytest

from dynamod.tasks import each


async def test_each_keeps_the_order_and_never_runs_more_than_its_width() -> None:
    running = 0
    most = 0

    async def work(item: int) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.001 * (item % 3))
        running -= 1
        return item * 10

    assert await each(range(50), 4, work) == [n * 10 for n in range(50)]
    assert most == 4
    assert await each([], 4, work) == []


async def test_the_first_failure_cancels_the_rest_and_propagates() -> None:
    cancelled: list[int] = []
    started: list[int] = []

    async def work(item: int) -> int:
        started.append(item)
        if item == 2:
            raise ValueError("two")
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(item)
            raise
        return item

    with pytest.raises(ValueError, match="two"):
        await each(range(10), 3, work)
    assert sorted(cancelled) == [0, 1] and started == [0, 1, 2]
