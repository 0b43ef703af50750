"""What the daemon's engine events connections hold in their buffers is bounded in total,
not only per line (issue 28: "a daemon-wide memory budget for relayed answers, tokenizer
fetches and engine-event buffers"). Against real HTTP servers on loopback in this process:
four workers each send their snapshot, then 60 KiB of a line that never ends (within the
64 KiB line limit), 240 KiB in all with a memory budget of 128 KiB. The connections
holding the most are closed, one warning each naming the budget, and retried after their
back-off; no worker is marked for it (the limit is the daemon's), and what is held stays
within the budget."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from aiohttp import web

from dynamod.boundary import Budgets, EngineStreams
from dynamod.discovery.registration import Registration, new_instance_id
from dynamod.discovery.view import WorkerView
from dynamod.engine_events import EVENTS_PATH, RECORD_FIELD, offer
from dynamod.http.memory import MemoryBudget
from dynamod.records import ModelCard, WorkerRecord
from dynamod.store import Store
from dynamod.store.memory import MemoryStore
from dynamod.tasks import cancel_and_wait
from tests.hostile_workers.events_fakes import SNAPSHOT, line
from tests.support.eventually import eventually
from tests.support.web import served

pytestmark = pytest.mark.timeout(60)

WORKERS = 4
PARTIAL = b'{"type": "state", "pad": "' + b"y" * (60 << 10)


@dataclass
class Endless:
    """A worker's events: its snapshot, then a line that never ends; counts connections."""

    done: asyncio.Event
    opened: int = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.opened += 1
        response = web.StreamResponse()
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            await response.write(line(SNAPSHOT))
            await response.write(PARTIAL)
            await self.done.wait()
        return response


@contextlib.asynccontextmanager
async def worker(store: Store, fake: Endless) -> AsyncIterator[WorkerRecord]:
    app = web.Application()
    app.router.add_get(EVENTS_PATH, fake.handle)
    async with served(app) as system:
        record = WorkerRecord(
            new_instance_id(), "dynamo", "backend", "generate", system, ModelCard(name="m"),
            system_address=system, extra={RECORD_FIELD: offer()},
        )  # fmt: skip
        async with Registration(store, record, ttl=30):
            yield record


async def test_engine_event_buffers_past_the_budget_close_the_largest_unmarked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "dynamod.http.memory")
    memory = MemoryBudget(128 << 10)
    done = asyncio.Event()
    fakes = [Endless(done) for _ in range(WORKERS)]
    async with MemoryStore() as store, contextlib.AsyncExitStack() as stack:
        records = [await stack.enter_async_context(worker(store, fake)) for fake in fakes]
        view = WorkerView(store)
        streams = EngineStreams(view, lambda key, load: None, budgets=Budgets(stall=60),
                                memory=memory)  # fmt: skip
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(view.run()), group.create_task(streams.run())]
            try:
                await eventually(  # 4 of 60 KiB: at most 2 fit in 128 KiB
                    lambda: asyncio.sleep(0.05, (sum(f.opened for f in fakes), memory.refusals)),
                    lambda seen: seen[0] > WORKERS and seen[1] >= 2,
                    within=30,
                    what="connections closed for the budget, and one opened again",
                )
                assert memory.held <= memory.limit
                assert all(streams.breaches.last(r.key) is None for r in records)
                assert caplog.text.count("engine events of worker") >= 2
                assert "over its memory budget of 131072" in caplog.text
            finally:
                done.set()
                for task in tasks:
                    await cancel_and_wait(task)
