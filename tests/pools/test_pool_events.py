"""Pool events for ``events tail``: a subscription that falls behind is told what it missed,
in the place it missed it, and never blocks the publisher."""

from __future__ import annotations

from dynamod.pool_results import PoolEventInfo
from dynamod.pools.pool_events import PoolEvents, PoolSubscription


async def shown(subscription: PoolSubscription, count: int) -> list[str]:
    """The next ``count`` events, each as its policy or as LOST with how many it missed."""
    events = [(await anext(subscription)).info for _ in range(count)]
    return [info.policy or f"{info.kind}: {info.message}" for info in events]


async def test_a_slow_subscription_gets_one_lost_event_where_the_events_were_dropped() -> None:
    events = PoolEvents()
    with events.subscribe(maxsize=3) as subscription:
        for revision, policy in enumerate("abcdef", start=1):
            events.publish(PoolEventInfo("APPLIED", policy), revision)
        assert await shown(subscription, 4) == [
            "a",
            "b",
            "c",
            "LOST: this stream fell behind: 3 pool events were dropped",
        ]


async def test_an_event_published_after_a_gap_comes_after_its_lost_event() -> None:
    events = PoolEvents()
    with events.subscribe(maxsize=2) as subscription:
        for revision, policy in enumerate("abc", start=1):
            events.publish(PoolEventInfo("APPLIED", policy), revision)
        assert await shown(subscription, 2) == ["a", "b"]
        events.publish(PoolEventInfo("APPLIED", "d"), 4)  # room again, behind the gap
        assert await shown(subscription, 2) == [
            "LOST: this stream fell behind: 1 pool events were dropped",
            "d",
        ]
