"""Memory a client can make the daemon keep: the event history that ``events tail --since``
replays from is bounded by bytes as well as by count, so huge taint sets rewritten over and
over do not grow the daemon without bound; so are the queues of the subscribers that do
not read (an ``events tail`` that never reads), each and all of them together."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from dynamod.discovery.registration import register
from dynamod.discovery.updates import update_taints
from dynamod.discovery.view import QUEUE_BYTES, QUEUES_BUDGET, Subscription, WorkerView
from dynamod.discovery_events import DiscoveryEvent, ViewResync, WorkerModified
from dynamod.store import Store
from dynamod.store.memory import MemoryStore
from dynamod.taints import TaintUpdate
from tests.support.factories import make_record

BIG = 2_000  # taints per update: ~150 kB of history each, by the view's own reckoning


async def test_the_event_history_keeps_within_its_byte_budget() -> None:
    async with MemoryStore() as store:
        record = make_record()
        lease = await store.grant(30)
        await register(store, record, lease)
        view = WorkerView(store, replay=10_000, replay_bytes=1024 * 1024)
        async with asyncio.TaskGroup() as group:
            task = group.create_task(view.run())
            async with asyncio.timeout(10):
                await view.ready.wait()
            revisions = []
            for round_ in range(40):
                taints = [f"t{round_}-{i}" for i in range(BIG)]
                change = await update_taints(store, record.key, TaintUpdate.replace(taints))
                revisions.append(change.revision)
            await view.wait_for(lambda v: v.revision >= revisions[-1])
            task.cancel()
    recent = view.backlog(revisions[-3])
    assert [type(e) for e in recent] == [WorkerModified, WorkerModified]
    (too_old,) = view.backlog(revisions[0])
    assert isinstance(too_old, ViewResync), "the oldest updates no longer fit the budget"


@contextlib.asynccontextmanager
async def watched(
    store: Store, *, queue_bytes: int = QUEUE_BYTES, queues_budget: int = QUEUES_BUDGET
) -> AsyncIterator[tuple[WorkerView, str]]:
    """A view with these bounds of one registered worker's store, watched; and its key."""
    record = make_record()
    await register(store, record, await store.grant(30))
    view = WorkerView(store, queue_bytes=queue_bytes, queues_budget=queues_budget)
    async with asyncio.TaskGroup() as group:
        task = group.create_task(view.run())
        async with asyncio.timeout(10):
            await view.ready.wait()
        yield view, record.key
        task.cancel()


async def churn(store: Store, key: str, view: WorkerView, rounds: int) -> list[int]:
    """``rounds`` replacements of ``BIG`` taints, once the view has seen them all; their
    revisions. Waits through a listener, which queues nothing of its own."""
    revisions = []
    for round_ in range(rounds):
        taints = [f"t{round_}-{i}" for i in range(BIG)]
        revisions.append((await update_taints(store, key, TaintUpdate.replace(taints))).revision)
    seen = asyncio.Event()
    stop = view.listen(lambda _: seen.set() if view.revision >= revisions[-1] else None)
    try:
        if view.revision < revisions[-1]:
            async with asyncio.timeout(10):
                await seen.wait()
    finally:
        stop()
    return revisions


async def first(subscription: Subscription, count: int = 1) -> list[DiscoveryEvent]:
    out: list[DiscoveryEvent] = []
    async with asyncio.timeout(10):
        while len(out) < count:
            out.append(await anext(subscription))
    return out


async def test_an_unread_subscription_holds_at_most_its_bytes() -> None:
    """20 events of ~150 kB: far under the count bound (1,024), over the byte bound (1
    MiB). The subscriber holds no more than its bound and, reading again, gets a resync of
    the current state."""
    async with MemoryStore() as store, watched(store, queue_bytes=1024 * 1024) as (view, key):
        with view.subscribe(since=view.revision) as events:
            await churn(store, key, view, 20)
            assert events.queued_bytes <= 1024 * 1024
            (event,) = await first(events)
    assert isinstance(event, ViewResync)
    assert event.records[0].taints == view.records()[0].taints
    assert events.resyncs >= 1


async def test_all_queues_stay_within_their_budget_the_furthest_behind_resyncs() -> None:
    """Two subscribers that do not read, one from earlier than the other, and a budget of
    about seven events for both: the one further behind is sent back to a resync, the
    other keeps every event, in order."""
    budget = 1024 * 1024
    async with MemoryStore() as store, watched(store, queues_budget=budget) as (view, key):
        with view.subscribe(since=view.revision) as behind:
            await churn(store, key, view, 4)
            with view.subscribe(since=view.revision) as recent:
                revisions = await churn(store, key, view, 4)
                assert behind.queued_bytes + recent.queued_bytes <= budget
                (resync,) = await first(behind)
                kept = await first(recent, 4)
    assert isinstance(resync, ViewResync)
    assert resync.revision == revisions[-1]
    assert [type(e) for e in kept] == [WorkerModified] * 4
    assert [e.revision for e in kept] == revisions
    assert recent.resyncs == 0
