"""The daemon's reader of a worker's engine events stream (``boundary/events_stream.py``)
and the task that follows it (``boundary/engine_streams.py``), against real HTTP servers
on loopback in this process: every malformed line of the hostile fakes is refused as
malformed, a line is held to its byte limit and to its time budget, and an exception of
any kind while a worker's bytes are handled marks that worker and leaves the task alive."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from dynamod.boundary import Breach, BreachKind, Budgets, EngineStreams, KvIndexer, RateBudget
from dynamod.boundary.breaches import kind_of
from dynamod.boundary.events_stream import events
from dynamod.discovery.registration import Registration, new_instance_id
from dynamod.discovery.view import WorkerView
from dynamod.engine_events import RECORD_FIELD, EngineLoad, KvBatch, offer
from dynamod.errors import OversizeError
from dynamod.records import ModelCard, WorkerRecord
from dynamod.router.kvindex import KvIndex
from dynamod.store.memory import MemoryStore
from dynamod.tasks import cancel_and_wait
from tests.hostile_workers.events_fakes import MALFORMED, SNAPSHOT, Hostile, line
from tests.support.web import served

pytestmark = pytest.mark.timeout(60)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


DONE = web.AppKey("done", asyncio.Event)


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    app[DONE] = done = asyncio.Event()
    async with served(app) as url:
        try:
            yield url
        finally:
            done.set()


def streaming(*chunks: bytes, pause: float = 0.0) -> web.Application:
    """An app whose ``/engine/events`` sends ``chunks`` (``pause`` seconds apart), then
    stays silent until the test is done."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            for chunk in chunks:
                await response.write(chunk)
                await asyncio.sleep(pause)
        await request.app[DONE].wait()
        return response

    app = web.Application()
    app.router.add_get("/engine/events", handler)
    return app


async def read_all(url: str, budgets: Budgets, got: list[EngineLoad | KvBatch]) -> None:
    """Read the stream at ``url`` into ``got`` until it ends or raises."""
    async with aiohttp.ClientSession() as session:
        stream = events(session, url + "/engine/events", budgets, RateBudget(budgets))
        async for event in stream:
            got.append(event)  # noqa: PERF401 - kept one by one: what came before a refusal


async def test_every_malformed_line_a_hostile_worker_sends_is_refused_as_malformed() -> None:
    async with serving(Hostile("malformed").app()) as url:
        for bad in MALFORMED:
            got: list[EngineLoad | KvBatch] = []
            with pytest.raises(Exception) as refused:
                await read_all(url, Budgets(), got)
            assert got == [EngineLoad()], bad
            assert kind_of(refused.value) is BreachKind.MALFORMED, (bad, refused.value)
            assert len(str(refused.value)) < 1000, "a message never carries the line whole"


async def test_a_line_at_the_limit_is_read_and_one_byte_more_is_refused() -> None:
    budgets = Budgets(line=1024, stall=0.5)
    state = line(SNAPSHOT)
    padded = state[:-2] + b',"pad":"' + b"x" * (1024 - len(state) - 9) + b'"}\n'
    assert len(padded) == 1024
    over = padded[:-3] + b'x"}\n'
    async with serving(streaming(padded, over)) as url:
        got: list[EngineLoad | KvBatch] = []
        with pytest.raises(OversizeError, match="over its limit of 1024 bytes"):
            await read_all(url, budgets, got)
        assert got == [EngineLoad()]


async def test_a_line_sent_a_byte_at_a_time_is_held_to_the_time_budget() -> None:
    """Every byte comes well within the stall, the line never does."""
    budgets = Budgets(stall=0.5)
    async with serving(streaming(line(SNAPSHOT), *[b"{"] * 100, pause=0.1)) as url:
        with pytest.raises(TimeoutError):
            await read_all(url, budgets, [])


async def test_a_worker_that_sends_more_than_its_budget_is_refused_as_too_fast() -> None:
    budgets = Budgets(events_burst=50, events_per_second=1)
    async with serving(Hostile("spam").app()) as url:
        with pytest.raises(Exception) as refused:
            await read_all(url, budgets, [])
    assert kind_of(refused.value) is BreachKind.TOO_FAST


class BrokenIndexer(KvIndexer):
    """A KV indexer with a bug: whatever a worker sends, applying it raises."""

    def __init__(self) -> None:
        super().__init__(KvIndex(), 1 << 20, CollectorRegistry())
        self.calls = 0
        self.called = asyncio.Event()

    def batch(self, key: str, batch: KvBatch) -> None:
        self.calls += 1
        self.called.set()
        raise RuntimeError("a bug, not the worker's fault, yet its bytes got there")


async def test_any_exception_while_a_workers_bytes_are_handled_marks_it_and_the_task_lives() -> (
    None
):
    indexer = BrokenIndexer()
    async with MemoryStore() as store, serving(Hostile("kv_flood").app()) as url:
        record = WorkerRecord(
            new_instance_id(), "dynamo", "backend", "generate", url, ModelCard("hostile"),
            system_address=url, extra={RECORD_FIELD: offer(kv=True)},
        )  # fmt: skip
        view = WorkerView(store)
        marks: list[EngineLoad | None] = []
        streams = EngineStreams(view, lambda key, load: marks.append(load), kv=indexer)
        async with Registration(store, record, ttl=5), asyncio.TaskGroup() as group:
            tasks = [group.create_task(view.run()), group.create_task(streams.run())]
            async with asyncio.timeout(20):
                await indexer.called.wait()
                indexer.called.clear()
                await indexer.called.wait()  # the same worker, followed again
            last = streams.breaches.last(record.key)
            assert last is not None and last.kind is BreachKind.MALFORMED
            assert "RuntimeError" in last.message
            assert any(m is not None and m.source == "boundary" for m in marks)
            assert not tasks[1].done() and indexer.calls >= 2
            for task in tasks:
                await cancel_and_wait(task)
    assert marks[-1] is None, "a worker that leaves is forgotten"
    assert isinstance(last, Breach)
