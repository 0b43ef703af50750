"""The daemon's HTTP/1.1 reader for engine streams (``http/stream_get.py``) against raw
servers on loopback that send exactly the bytes each test writes: the framings a worker
may use come through whole (chunked split anywhere, ``Content-Length``, the connection's
end), and each bound holds against a peer that breaks it (a head over its cap, a chunk
size line that is garbage or endless, a connection closed mid-chunk, a huge line, a
compressed body, a flood), with the breach kind ``EngineStreams`` would mark it for."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from dynamod.boundary import BreachKind, EngineStreams
from dynamod.boundary.breaches import kind_of
from dynamod.discovery.registration import Registration, new_instance_id
from dynamod.discovery.view import WorkerView
from dynamod.engine_events import RECORD_FIELD, EngineLoad, offer
from dynamod.errors import InvalidInputError, OversizeError
from dynamod.http.bounded import EncodingError, LineReader
from dynamod.http.stream_get import (
    HEAD_LIMIT,
    HIGH_WATER,
    SIZE_LINE,
    FramingError,
    StreamUnavailableError,
    stream_get,
)
from dynamod.records import ModelCard, WorkerRecord
from dynamod.store.memory import MemoryStore
from dynamod.tasks import cancel_and_wait
from tests.hostile_workers.events_fakes import SNAPSHOT, line
from tests.support.eventually import eventually

pytestmark = pytest.mark.timeout(60)

OK_CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
MAX_READ = 256 << 10
"""The most one read of a socket hands the protocol (asyncio's transports)."""


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Raw:
    """A server on loopback that answers every connection with ``pieces``, each written
    on its own, then closes it (``close``) or holds it until the test ends."""

    def __init__(self, *pieces: bytes, close: bool = True) -> None:
        self.pieces = pieces
        self.close = close
        self.requests: list[bytes] = []
        self.done = asyncio.Event()
        self.answering: set[asyncio.Task[object]] = set()

    async def answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.answering.add(task)
        task.add_done_callback(self.answering.discard)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            self.requests.append(await reader.readuntil(b"\r\n\r\n"))
            for piece in self.pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.001)  # one read each, as far as the loop goes
            if not self.close:
                await self.done.wait()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


@contextlib.asynccontextmanager
async def raw(*pieces: bytes, close: bool = True) -> AsyncIterator[str]:
    """A ``Raw`` server's stream URL (its ``/w0/engine/events``)."""
    async with serving(Raw(*pieces, close=close)) as url:
        yield url


@contextlib.asynccontextmanager
async def serving(server: Raw) -> AsyncIterator[str]:
    listener = await asyncio.start_server(server.answer, "127.0.0.1", 0)
    async with listener:
        port = listener.sockets[0].getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}/w0/engine/events"
        finally:
            server.done.set()
            await asyncio.gather(*server.answering)  # each ends once its peer has gone


async def lines_of(url: str, limit: int = 1 << 16) -> list[bytes]:
    """Every line of the body at ``url``, read within ``limit`` bytes a line."""
    body = await stream_get(url)
    try:
        reader = LineReader(body, limit, "the test stream")
        return [line async for line in _lines(reader)]
    finally:
        body.close()


async def _lines(reader: LineReader) -> AsyncIterator[bytes]:
    while (got := await reader.next_line()) is not None:
        yield got


async def refused(url: str) -> Exception:
    """What reading the stream at ``url`` raised (it must raise)."""
    with pytest.raises(Exception) as caught:
        await lines_of(url)
    assert isinstance(caught.value, Exception)
    return caught.value


async def test_a_chunked_body_split_anywhere_comes_through_as_its_lines() -> None:
    """Chunk size lines, chunk data and lines cut at every byte, in separate reads; an
    extension and a trailer on the way; the request asks for no encoding."""
    wire = chunk(b"ab") + b"5;ext=1\r\nc\nde\n\r\n" + chunk(b"f\ntail") + b"0\r\nX-T: 1\r\n\r\n"
    pieces = [OK_CHUNKED[:9], OK_CHUNKED[9:], *[bytes([b]) for b in wire]]
    async with raw(*pieces, close=False) as url:
        assert await lines_of(url) == [b"abc\n", b"de\n", b"f\n", b"tail"]


async def test_the_request_names_the_host_and_asks_for_no_encoding() -> None:
    server = Raw(OK_CHUNKED, b"0\r\n\r\n")
    async with serving(server) as url:
        assert await lines_of(url + "?x=1") == []
        port = url.split(":")[2].split("/")[0]
    [request] = server.requests
    assert request.startswith(b"GET /w0/engine/events?x=1 HTTP/1.1\r\n")
    assert f"\r\nHost: 127.0.0.1:{port}\r\n".encode() in request
    assert b"\r\nAccept-Encoding: identity\r\n" in request


async def test_a_content_length_body_ends_at_its_length_while_the_connection_stays() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n"
    async with raw(head, b"one\ntw", b"o\nnever read\n", close=False) as url:
        assert await lines_of(url) == [b"one\n", b"two\n"]


async def test_a_body_without_length_or_chunks_ends_with_the_connection() -> None:
    async with raw(b"HTTP/1.0 200 OK\r\n\r\n", b"one\n", b"two\nthree") as url:
        assert await lines_of(url) == [b"one\n", b"two\n", b"three"]


async def test_a_head_at_its_cap_is_read_and_one_over_it_is_refused_as_oversize() -> None:
    start, end = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nX-Pad: ", b"\r\n\r\n"
    padded = start + b"p" * (HEAD_LIMIT - len(start) - len(end)) + end
    assert len(padded) == HEAD_LIMIT  # the empty line that ends it included
    async with raw(padded, b"ok\n") as url:
        assert await lines_of(url) == [b"ok\n"]
    over = start + b"p" * (HEAD_LIMIT - len(start) - len(end) + 1) + end
    async with raw(over, b"ok\n", close=False) as url:
        error = await refused(url)
    assert isinstance(error, OversizeError) and kind_of(error) is BreachKind.OVERSIZE
    assert f"over its limit of {HEAD_LIMIT} bytes" in str(error)


async def test_a_head_that_never_ends_is_refused_without_reading_it_all() -> None:
    async with raw(b"HTTP/1.1 200 OK\r\n", *[b"X-Endless: y\r\n" * 1000] * 100) as url:
        error = await refused(url)
    assert isinstance(error, OversizeError)


@pytest.mark.parametrize(
    "bad",
    [
        b"zz\r\n",  # not hex
        b"-5\r\n",
        b"5 5\r\n",
        b"\r\n",  # empty
        b"11111111111111111\r\n",  # 17 digits
        b"5\nabcde\r\n",  # a bare LF
    ],
)
async def test_a_chunk_size_line_that_is_garbage_is_refused_as_malformed(bad: bytes) -> None:
    async with raw(OK_CHUNKED, chunk(b"first\n"), bad, b"more\n", close=False) as url:
        error = await refused(url)
    assert isinstance(error, FramingError) and kind_of(error) is BreachKind.MALFORMED
    assert "where a chunk size was due" in str(error)


async def test_a_chunk_size_line_that_never_ends_is_refused_as_oversize() -> None:
    async with raw(OK_CHUNKED, b"1;" + b"e" * SIZE_LINE, close=False) as url:
        error = await refused(url)
    assert isinstance(error, OversizeError)
    assert f"a chunk size line of {url} is over its limit of {SIZE_LINE}" in str(error)


async def test_chunk_data_not_followed_by_crlf_is_refused_as_malformed() -> None:
    async with raw(OK_CHUNKED, b"3\r\nabcdef\r\n", close=False) as url:
        error = await refused(url)
    assert isinstance(error, FramingError) and "(CRLF) was due" in str(error)


async def test_a_connection_closed_mid_chunk_is_a_broken_connection_not_a_breach() -> None:
    """The lines before the cut are read; the cut is a ``ConnectionError`` (nothing known
    of the worker, as when it is killed), never a mark."""
    async with raw(OK_CHUNKED, chunk(b"whole\n"), b"10\r\nhalf a ch") as url:
        body = await stream_get(url)
        reader = LineReader(body, 1 << 16, "the test stream")
        try:
            assert await reader.next_line() == b"whole\n"
            with pytest.raises(StreamUnavailableError, match="in the middle of its answer"):
                await reader.next_line()
        finally:
            body.close()
    assert isinstance(StreamUnavailableError("x"), ConnectionError)


async def test_a_content_length_body_cut_short_is_a_broken_connection() -> None:
    async with raw(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", b"short\n") as url:
        with pytest.raises(StreamUnavailableError):
            await lines_of(url)


async def test_a_huge_line_is_refused_at_the_line_limit_without_reading_it_all() -> None:
    """16 MiB of one line, in chunks: refused once the line passes the limit, and never
    more than the high-water mark and one read buffered meanwhile."""
    async with raw(OK_CHUNKED, *[chunk(b"z" * 65536)] * 256, close=False) as url:
        body = await stream_get(url)
        reader = LineReader(body, 1 << 16, "the test stream")
        try:
            with pytest.raises(OversizeError, match="over its limit of 65536 bytes"):
                await reader.next_line()
            assert body.buffered <= HIGH_WATER + MAX_READ
        finally:
            body.close()


async def test_a_flood_is_read_whole_within_the_high_water_mark() -> None:
    """8 MiB of lines sent at once to a reader that takes one line at a time: reading
    stops at the high-water mark and resumes as the reader catches up, so every line
    arrives and the buffer never holds more than the mark and one read."""
    lines = [b"%05d" % i + b"y" * 4090 + b"\n" for i in range(2048)]
    async with raw(OK_CHUNKED, *[chunk(b"".join(lines[i : i + 64])) for i in range(0, 2048, 64)],
                   b"0\r\n\r\n", close=False) as url:  # fmt: skip
        body = await stream_get(url)
        reader = LineReader(body, 1 << 16, "the test stream")
        got, most = [], 0
        try:
            while (next_line := await reader.next_line()) is not None:
                got.append(next_line)
                most = max(most, body.buffered)
                await asyncio.sleep(0)
        finally:
            body.close()
    assert got == lines
    assert most <= HIGH_WATER + MAX_READ


async def test_a_status_other_than_200_is_no_stream_and_no_breach() -> None:
    head = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
    async with raw(head) as url:
        error = await refused(url)
    assert isinstance(error, StreamUnavailableError) and "answered 503, not 200" in str(error)


async def test_a_connection_closed_before_its_head_is_no_stream() -> None:
    async with raw(b"HTTP/1.1 200 OK\r\nContent-") as url:
        error = await refused(url)
    assert isinstance(error, StreamUnavailableError) and "before it answered" in str(error)


@pytest.mark.parametrize(
    ("head", "says"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n", "Content-Encoding 'gzip'"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n", "only chunked is read"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n", "not one number"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n", "not one number"),
        (b"HTTP/1.1 200 OK\r\nX-Folded: a\r\n  b\r\n", "not a name, a colon and a value"),
        (b"HTTP/1.1 200 OK\r\nNo colon here\r\n", "not a name, a colon and a value"),
        (b"HTTP/1.1 200 OK\r\nX: a\nY: b\r\n", "not a name, a colon and a value"),
        (b"HTTP/2 200\r\n", "not an HTTP/1.1 status line"),
        (b"ICY 200 OK\r\n", "not an HTTP/1.1 status line"),
    ],
)
async def test_a_head_that_breaks_http_is_refused_as_malformed(head: bytes, says: str) -> None:
    async with raw(head + b"\r\n", line(SNAPSHOT), close=False) as url:
        error = await refused(url)
    assert isinstance(error, FramingError | EncodingError), error
    assert kind_of(error) is BreachKind.MALFORMED and says in str(error)


@pytest.mark.parametrize("url", ["https://127.0.0.1:1/e", "http://127.0.0.1:x/e", "http:///e"])
async def test_a_url_that_is_not_plain_http_is_refused_before_connecting(url: str) -> None:
    with pytest.raises(InvalidInputError, match="not an http:// URL"):
        await stream_get(url)


@pytest.mark.parametrize("url", ["http://wörker:1/e", "http://127.0.0.1:1/e\r\nX: y"])
async def test_a_url_that_cannot_be_sent_as_it_is_is_refused_before_connecting(url: str) -> None:
    with pytest.raises(InvalidInputError, match="cannot be sent as it is"):
        await stream_get(url)


@pytest.mark.parametrize(
    ("pieces", "marked"),
    [
        ((OK_CHUNKED, chunk(line(SNAPSHOT)), b"zz\r\n"), BreachKind.MALFORMED),
        ((b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n\r\n",), BreachKind.MALFORMED),
        ((b"HTTP/1.1 200 OK\r\nX: " + b"x" * HEAD_LIMIT,), BreachKind.OVERSIZE),
        ((b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n",), None),
    ],
)
async def test_a_worker_whose_http_breaks_is_marked_and_one_that_says_503_is_not(
    pieces: tuple[bytes, ...], marked: BreachKind | None
) -> None:
    """Through ``EngineStreams``, as the daemon follows a worker: broken HTTP is a breach
    of the worker's boundary; a status other than 200 is nothing known (``None``)."""
    reports: list[EngineLoad | None] = []
    async with MemoryStore() as store, raw(*pieces, close=marked is None) as url:
        system = url.removesuffix("/engine/events")
        record = WorkerRecord(
            new_instance_id(), "dynamo", "backend", "generate", system, ModelCard(name="m"),
            system_address=system, extra={RECORD_FIELD: offer()},
        )  # fmt: skip
        view = WorkerView(store)
        streams = EngineStreams(view, lambda key, load: reports.append(load))
        async with Registration(store, record, ttl=30), asyncio.TaskGroup() as group:
            tasks = [group.create_task(view.run()), group.create_task(streams.run())]
            if marked is None:
                await eventually(lambda: asyncio.sleep(0, reports), what="a report")
                assert streams.breaches.last(record.key) is None
                assert all(report is None for report in reports), reports
            else:
                last = await eventually(
                    lambda: asyncio.sleep(0, streams.breaches.last(record.key)), what="a mark"
                )
                assert last.kind is marked, last
            for task in tasks:
                await cancel_and_wait(task)
