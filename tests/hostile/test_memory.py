"""Memory a client can make the daemon keep: the event history that ``events tail --since``
replays from is bounded by bytes as well as by count, so huge taint sets rewritten over and
over do not grow the daemon without bound."""

from __future__ import annotations

import asyncio

from dynamod.discovery.registration import register
from dynamod.discovery.updates import update_taints
from dynamod.discovery.view import WorkerView
from dynamod.discovery_events import ViewResync, WorkerModified
from dynamod.store.memory import MemoryStore
from dynamod.taints import TaintUpdate
from tests.factories import make_record

BIG = 2_000  # taints per update: ~150 kB of history each, by the view's own reckoning


async def test_the_event_history_keeps_within_its_byte_budget() -> None:
    async with MemoryStore() as store:
        record = make_record()
        lease = await store.grant(30)
        await register(store, record, lease)
        view = WorkerView(store, history=10_000, history_bytes=1024 * 1024)
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
