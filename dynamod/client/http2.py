"""The client end of one HTTP/2 connection (RFC 9113), as much as gRPC's calls need: the
light client's transport (``dynamod.client.light``).

Frames are read by one task and handed to each stream's queue; header blocks are
(de)compressed with ``hpack``. Flow control both ways: what the caller has taken from a
stream is given back to the peer (``WINDOW_UPDATE``, in steps of half the window, so a
10,000-worker listing of ~7 MB flows without a stall), and a request never sends more than
the peer's windows allow. The peer's ``SETTINGS`` are applied and acknowledged, its
``PING`` answered; ``GOAWAY`` ends the streams it did not take, and a connection lost ends
every stream with the reason. No server push (refused in our ``SETTINGS``), no priorities.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from typing import Any

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE = (
    0,
    1,
    3,
    4,
    5,
    6,
    7,
    8,
)
CONTINUATION = 9
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY = 0x4, 0x8, 0x20
HEADER_TABLE_SIZE, ENABLE_PUSH, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 1, 2, 4, 5
CANCEL = 8  # RST_STREAM's code for a call given up
WINDOW = 1 << 24
"""What we let the peer send ahead, per stream and on the connection (16 MiB)."""
DEFAULT_WINDOW = 65_535
_HEAD = struct.Struct(">I B I")  # length (24 bits, after the type shifted in), flags, stream


class ConnectionLost(Exception):
    """The connection ended (``reason``: in the words gRPC uses where we know them)."""


Event = tuple[str, Any, Any]


class Stream:
    """One request's answer as it arrives, as events in order: ``("headers", [(name,
    value)], end_stream)``, ``("data", bytes, size on the wire)``, ``("end", None, None)``,
    ``("reset", code, None)``, ``("lost", reason, None)``."""

    def __init__(self, connection: Connection, stream_id: int) -> None:
        self.connection = connection
        self.id = stream_id
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.send_window = connection.peer_window
        self.sendable = asyncio.Event()
        self.taken = 0  # bytes taken from it, not yet given back to the peer
        self.closed = False  # ended both ways, or reset: nothing more to send or cancel

    async def next(self) -> Event:
        event = await self.events.get()
        if event[0] == "data":
            self.connection.consumed(self, event[2])
        return event

    def cancel(self) -> None:
        """Give up the call: ``RST_STREAM`` (CANCEL), unless it is over already."""
        if not self.closed:
            self.closed = True
            self.connection.reset(self)


class Connection:
    """A connection over ``open`` streams: ``request`` starts a stream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.encoder, self.decoder = hpack.Encoder(), hpack.Decoder()
        self.streams: dict[int, Stream] = {}
        self.next_id = 1
        self.peer_window = DEFAULT_WINDOW  # the peer's initial window for each stream
        self.send_window = DEFAULT_WINDOW  # the connection's, for what we send
        self.max_frame = 16_384
        self.unacknowledged = 0  # bytes taken on the connection, not yet given back
        self.lost: str | None = None
        self.last_stream = 1 << 31  # GOAWAY's: streams above it were not taken
        self.reading: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Connection:
        """Our preface and settings, then the peer's settings (which must come first):
        an answer that is not HTTP/2 raises ``ConnectionLost`` before anything was asked."""
        connection = cls(reader, writer)
        settings = struct.pack(">HIHI", ENABLE_PUSH, 0, INITIAL_WINDOW_SIZE, WINDOW)
        writer.write(PREFACE + _frame(SETTINGS, 0, 0, settings))
        writer.write(_frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", WINDOW - DEFAULT_WINDOW)))
        await writer.drain()
        kind, flags, _, payload = await connection._read_frame()
        if kind != SETTINGS or flags & ACK:
            raise ConnectionLost("the peer does not speak HTTP/2")
        connection._settings(flags, payload)
        connection.reading = asyncio.create_task(connection._read(), name="http2-reader")
        return connection

    @property
    def usable(self) -> bool:
        """Whether a new stream may start here."""
        return self.lost is None and self.next_id <= self.last_stream

    async def request(
        self, headers: Sequence[tuple[str, str]], body: bytes, secrets: Sequence[tuple[str, str]]
    ) -> Stream:
        """Start a stream: ``headers`` and ``secrets`` (headers HPACK must never put in its
        tables: a token), then ``body`` in DATA frames as the windows allow, the last one
        ending the stream."""
        if not self.usable:
            raise ConnectionLost(self.lost or "the server is going away")
        stream = Stream(self, self.next_id)
        self.next_id += 2
        self.streams[stream.id] = stream
        hidden = [hpack.NeverIndexedHeaderTuple(name, value) for name, value in secrets]
        block = self.encoder.encode([*headers, *hidden])
        first, rest = block[: self.max_frame], block[self.max_frame :]
        flags = 0 if rest else END_HEADERS
        self.writer.write(_frame(HEADERS, flags, stream.id, first))
        while rest:
            piece, rest = rest[: self.max_frame], rest[self.max_frame :]
            self.writer.write(_frame(CONTINUATION, 0 if rest else END_HEADERS, stream.id, piece))
        sent = 0
        while True:
            room = min(stream.send_window, self.send_window, self.max_frame, len(body) - sent)
            if room <= 0 and sent < len(body):
                await self.writer.drain()
                await self._sendable(stream)
                continue
            piece = body[sent : sent + room]
            sent += len(piece)
            stream.send_window -= len(piece)
            self.send_window -= len(piece)
            self.writer.write(
                _frame(DATA, END_STREAM if sent >= len(body) else 0, stream.id, piece)
            )
            if sent >= len(body):
                break
        await self.writer.drain()
        return stream

    async def _sendable(self, stream: Stream) -> None:
        stream.sendable.clear()
        if self.lost is not None:
            raise ConnectionLost(self.lost)
        await stream.sendable.wait()
        if self.lost is not None:
            raise ConnectionLost(self.lost)

    def consumed(self, stream: Stream | None, size: int) -> None:
        """``size`` bytes of DATA were taken from ``stream`` (None: one given up): give
        them back to the peer, half a window at a time, on the stream and the connection."""
        updates = b""
        if stream is not None:
            stream.taken += size
            if stream.taken >= WINDOW // 2 and not stream.closed:
                updates += _frame(WINDOW_UPDATE, 0, stream.id, struct.pack(">I", stream.taken))
                stream.taken = 0
        self.unacknowledged += size
        if self.unacknowledged >= WINDOW // 2:
            updates += _frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.unacknowledged))
            self.unacknowledged = 0
        if updates and self.lost is None:
            self.writer.write(updates)

    def reset(self, stream: Stream) -> None:
        self.streams.pop(stream.id, None)
        if self.lost is None:
            self.writer.write(_frame(RST_STREAM, 0, stream.id, struct.pack(">I", CANCEL)))

    def done(self, stream: Stream) -> None:
        """``stream`` has ended both ways: forget it."""
        stream.closed = True
        self.streams.pop(stream.id, None)

    async def close(self) -> None:
        """End the connection (the streams still open end as lost). Idempotent."""
        self._lose("the connection was closed")
        if self.reading is not None and self.reading is not asyncio.current_task():
            self.reading.cancel()
            await asyncio.gather(self.reading, return_exceptions=True)
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (OSError, ConnectionError):  # it went first: closed all the same
            pass

    async def _read_frame(self) -> tuple[int, int, int, bytes]:
        head = await self.reader.readexactly(9)
        length_type, flags, stream_id = _HEAD.unpack(head)
        length, kind = length_type >> 8, length_type & 0xFF
        payload = await self.reader.readexactly(length) if length else b""
        return kind, flags, stream_id & 0x7FFFFFFF, payload

    async def _read(self) -> None:
        try:
            while True:
                kind, flags, stream_id, payload = await self._read_frame()
                if kind == HEADERS:
                    payload = await self._header_block(flags, stream_id, payload)
                self._dispatch(kind, flags, stream_id, payload)
        except asyncio.IncompleteReadError:
            self._lose("Socket closed")
        except OSError as exc:
            self._lose(exc.strerror or type(exc).__name__)
        except (ConnectionLost, hpack.HPACKError, struct.error, ValueError) as exc:
            self._lose(f"the daemon's HTTP/2 could not be read: {exc}")

    async def _header_block(self, flags: int, stream_id: int, payload: bytes) -> bytes:
        """A HEADERS frame's block, its CONTINUATION frames joined on; ``END_STREAM`` and
        the block are all the caller needs (padding and priority dropped)."""
        if flags & PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        if flags & PRIORITY:
            payload = payload[5:]
        block = [payload]
        while not flags & END_HEADERS:
            kind, more, continued, piece = await self._read_frame()
            if kind != CONTINUATION or continued != stream_id:
                raise ConnectionLost("a header block was interrupted")
            flags |= more & END_HEADERS
            block.append(piece)
        return b"".join(block)

    def _dispatch(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        stream = self.streams.get(stream_id)
        if kind == HEADERS:
            headers = self.decoder.decode(payload)  # always: it keeps the table in step
            if stream is not None:
                stream.events.put_nowait(("headers", headers, bool(flags & END_STREAM)))
                if flags & END_STREAM:
                    self.done(stream)
        elif kind == DATA:
            size = len(payload)
            if flags & PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if stream is None:  # a stream we gave up: its data still counts on the connection
                self.consumed(None, size)
                return
            stream.events.put_nowait(("data", payload, size))
            if flags & END_STREAM:
                stream.events.put_nowait(("end", None, None))
                self.done(stream)
        elif kind == RST_STREAM and stream is not None:
            stream.events.put_nowait(("reset", struct.unpack(">I", payload)[0], None))
            self.done(stream)
        elif kind == SETTINGS:
            self._settings(flags, payload)
        elif kind == PING and not flags & ACK:
            self.writer.write(_frame(PING, ACK, 0, payload))
        elif kind == GOAWAY:
            self.last_stream = struct.unpack(">I", payload[:4])[0] & 0x7FFFFFFF
            for taken in [s for i, s in self.streams.items() if i > self.last_stream]:
                taken.events.put_nowait(("lost", "the server is going away", None))
                self.done(taken)
        elif kind == WINDOW_UPDATE:
            self._window(stream_id, stream, struct.unpack(">I", payload)[0] & 0x7FFFFFFF)
        elif kind == PUSH_PROMISE:
            raise ConnectionLost("the server pushed a stream, which we refused")

    def _window(self, stream_id: int, stream: Stream | None, increment: int) -> None:
        if stream_id == 0:
            self.send_window += increment
            for each in self.streams.values():
                each.sendable.set()
        elif stream is not None:
            stream.send_window += increment
            stream.sendable.set()

    def _settings(self, flags: int, payload: bytes) -> None:
        if flags & ACK:
            return
        for at in range(0, len(payload) - len(payload) % 6, 6):
            key, value = struct.unpack(">HI", payload[at : at + 6])
            if key == INITIAL_WINDOW_SIZE:
                for stream in self.streams.values():
                    stream.send_window += value - self.peer_window
                    stream.sendable.set()
                self.peer_window = value
            elif key == MAX_FRAME_SIZE:
                self.max_frame = value
            elif key == HEADER_TABLE_SIZE:
                self.encoder.header_table_size = value
        self.writer.write(_frame(SETTINGS, ACK, 0, b""))

    def _lose(self, reason: str) -> None:
        if self.lost is not None:
            return
        self.lost = reason
        for stream in list(self.streams.values()):
            stream.events.put_nowait(("lost", reason, None))
            stream.sendable.set()
            self.done(stream)


def _frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return _HEAD.pack(len(payload) << 8 | kind, flags, stream_id) + payload
