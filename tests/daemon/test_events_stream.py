"""The daemon's reader of a worker's engine events stream (``boundary/events_stream.py``)
and the task that follows it (``boundary/engine_streams.py``), against real HTTP servers
on loopback in this process: every malformed line of the hostile fakes is refused as
malformed, a line is held to its byte limit and to its time budget, and an exception of
any kind while a worker's bytes are handled marks that worker and leaves the task alive."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from dynamod.boundary import Breach, BreachKind, Budgets, EngineStreams, KvIndexer, RateBudget
from dynamod.boundary.breaches import kind_of
from dynamod.boundary.events_stream import events
from dynamod.discovery.registration import Registration, new_instance_id
from dynamod.discovery.view import WorkerView
from dynamod.engine_events import EVENTS_PATH, RECORD_FIELD, EngineLoad, offer
from dynamod.errors import OversizeError
from dynamod.kv_events import KvBatch
from dynamod.records import ModelCard, WorkerRecord
from dynamod.router.kvindex import KvIndex
from dynamod.store.memory import MemoryStore
from dynamod.tasks import cancel_and_wait
from tests.hostile_workers.events_fakes import MALFORMED, SNAPSHOT, Hostile, line
from tests.support.eventually import eventually
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
    stream = events(url + "/engine/events", budgets, RateBudget(budgets))
    async with contextlib.aclosing(stream):
        async for event in stream:
            if event is not None:  # a heartbeat
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


@contextlib.contextmanager
def in_a_thread(*chunks: bytes, pause: float) -> Iterator[str]:
    """A worker's events stream served by a thread, not the test's loop (which a test may
    starve): ``chunks`` ``pause`` seconds apart to the first connection, then silence
    until the test is done. Yields its URL."""
    done = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(30)  # a test that never connects ends the thread too

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            request = b""
            while b"\r\n\r\n" not in request:
                request += connection.recv(4096)
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/jsonl\r\n"
            connection.sendall(head + b"Connection: close\r\n\r\n")
            for chunk in chunks:
                connection.sendall(chunk)
                time.sleep(pause)
            done.wait()

    thread = threading.Thread(target=serve, name="events stream")
    with listener:
        thread.start()
        try:
            yield f"http://127.0.0.1:{listener.getsockname()[1]}"
        finally:
            done.set()
            thread.join()


async def test_a_line_that_arrived_in_time_on_a_starved_loop_is_no_stall() -> None:
    """The daemon's own loop, starved past the stall budget, finds the worker's line
    already received: that line came in time (both workers of a loaded engines fleet were
    once marked together for the daemon's own pause)."""
    budgets = Budgets(stall=0.5)
    lines = (line(SNAPSHOT), b'{"type": "heartbeat"}\n')
    with in_a_thread(*lines, pause=0.1) as url:
        stream = events(url + "/engine/events", budgets, RateBudget(budgets))
        async with contextlib.aclosing(stream):
            assert await anext(stream) == EngineLoad()
            following = asyncio.ensure_future(anext(stream))
            await asyncio.sleep(0)  # it waits for the next line
            time.sleep(budgets.stall * 3)  # noqa: ASYNC251 - the starved loop itself
            assert await following is None


async def test_an_idle_worker_marked_for_a_silence_is_lifted_by_its_heartbeats() -> None:
    """An honest idle worker sends only heartbeats: after one silent connection marked it
    (a starved machine), a connection that keeps heartbeating past the progress budget
    lifts the mark, with no state change needed."""
    budgets = Budgets(stall=0.5, progress=1.0)
    opened = 0

    async def stream(request: web.Request) -> web.StreamResponse:
        nonlocal opened
        opened += 1
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(line(SNAPSHOT))
        with contextlib.suppress(ConnectionError):
            while True:  # the first connection is silent past the stall, the others beat
                await asyncio.sleep(budgets.stall * 4 if opened == 1 else 0.05)
                await response.write(b'{"type": "heartbeat"}\n')
        return response

    app = web.Application()
    app.router.add_get(EVENTS_PATH, stream)
    marks: list[EngineLoad | None] = []
    async with MemoryStore() as store, served(app) as system:
        record = WorkerRecord(
            new_instance_id(), "dynamo", "backend", "generate", system, ModelCard(name="m"),
            system_address=system, extra={RECORD_FIELD: offer()},
        )  # fmt: skip
        view = WorkerView(store)
        streams = EngineStreams(view, lambda key, load: marks.append(load), budgets=budgets)
        async with Registration(store, record, ttl=30), asyncio.TaskGroup() as group:
            tasks = [group.create_task(view.run()), group.create_task(streams.run())]

            async def lifted() -> bool:
                return opened > 1 and streams.breaches.last(record.key) is None

            await eventually(lifted, accept=bool, within=30, what="the mark lifted")
            assert any(m is not None and "(timeout)" in m.reason for m in marks)
            assert marks[-1] is not None and marks[-1].healthy
            for task in tasks:
                await cancel_and_wait(task)


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
