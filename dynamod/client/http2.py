"""The client end of one HTTP/2 connection (RFC 9113) over a blocking socket, as much as
gRPC's calls need: the light client's transport (``dynamod.client.light``).

No event loop and no thread: a caller waiting on a stream reads frames off the socket until
its stream has something (``Http2Stream.next``), handing what belongs to other streams to their
queues. Header blocks are (de)compressed with ``hpack``. Flow control both ways: what the
caller has taken from a stream is given back to the peer (``WINDOW_UPDATE``, half a window
at a time, so a 10,000-worker listing of ~7 MB flows without a stall), and a request never
sends more than the peer's windows allow. The peer's ``SETTINGS`` are applied and
acknowledged, its ``PING`` answered; ``GOAWAY`` ends the streams it did not take, and a
connection lost ends every stream with the reason. No server push (refused in our
``SETTINGS``), no priorities.
"""

from __future__ import annotations

import socket
import struct
import time
from collections import deque
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
_HEAD = struct.Struct(">IBI")  # length (24 bits) and type, flags, stream

Event = tuple[str, Any, Any]


class ConnectionLost(Exception):
    """The connection ended (the reason: in the words gRPC uses where we know them)."""


class Http2Stream:
    """One request's answer as it arrives, as events in order: ``("headers", [(name,
    value)], end_stream)``, ``("data", bytes, size on the wire)``, ``("end", None, None)``,
    ``("reset", code, None)``, ``("lost", reason, None)``."""

    def __init__(self, connection: Http2Connection, stream_id: int) -> None:
        self.connection = connection
        self.id = stream_id
        self.events: deque[Event] = deque()
        self.send_window = connection.peer_window
        self.taken = 0  # bytes taken from it, not yet given back to the peer
        self.closed = False  # ended both ways, or reset: nothing more to send or cancel

    def next(self, deadline: float | None) -> Event:
        """The next event, read off the socket if need be; ``TimeoutError`` once the
        ``time.monotonic()`` ``deadline`` passes (None: no limit)."""
        while not self.events:
            self.connection.pump(deadline)
        event = self.events.popleft()
        if event[0] == "data":
            self.connection.consumed(self, event[2])
        return event

    def cancel(self) -> None:
        """Give up the call: ``RST_STREAM`` (CANCEL), unless it is over already."""
        if not self.closed:
            self.closed = True
            self.connection.reset(self)


class Http2Connection:
    """A connection over an open socket: ``request`` starts a stream."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.encoder, self.decoder = hpack.Encoder(), hpack.Decoder()
        self.streams: dict[int, Http2Stream] = {}
        self.next_id = 1
        self.peer_window = DEFAULT_WINDOW  # the peer's initial window for each stream
        self.send_window = DEFAULT_WINDOW  # the connection's, for what we send
        self.max_frame = 16_384
        self.unacknowledged = 0  # bytes taken on the connection, not yet given back
        self.lost: str | None = None
        self.last_stream = 1 << 31  # GOAWAY's: streams above it were not taken
        self.buffer = bytearray()

    @classmethod
    def open(cls, sock: socket.socket, deadline: float) -> Http2Connection:
        """Our preface and settings, then the peer's settings (which must come first):
        an answer that is not HTTP/2 raises ``ConnectionLost`` before anything was asked."""
        connection = cls(sock)
        settings = struct.pack(">HIHI", ENABLE_PUSH, 0, INITIAL_WINDOW_SIZE, WINDOW)
        increment = struct.pack(">I", WINDOW - DEFAULT_WINDOW)
        connection._send(
            PREFACE + _frame(SETTINGS, 0, 0, settings) + _frame(WINDOW_UPDATE, 0, 0, increment)
        )
        kind, flags, _, payload = connection._read_frame(deadline)
        if kind != SETTINGS or flags & ACK:
            raise ConnectionLost("the peer does not speak HTTP/2")
        connection._settings(flags, payload)
        return connection

    @property
    def usable(self) -> bool:
        """Whether a new stream may start here."""
        return self.lost is None and self.next_id <= self.last_stream

    def request(
        self,
        headers: Sequence[tuple[str, str]],
        body: bytes,
        secrets: Sequence[tuple[str, str]],
        deadline: float | None,
    ) -> Http2Stream:
        """Start a stream: ``headers`` and ``secrets`` (headers HPACK must never put in its
        tables: a token), then ``body`` in DATA frames as the windows allow, the last one
        ending the stream."""
        if not self.usable:
            raise ConnectionLost(self.lost or "the server is going away")
        stream = Http2Stream(self, self.next_id)
        self.next_id += 2
        self.streams[stream.id] = stream
        hidden = [hpack.NeverIndexedHeaderTuple(name, value) for name, value in secrets]
        block = self.encoder.encode([*headers, *hidden])
        first, rest = block[: self.max_frame], block[self.max_frame :]
        frames = [_frame(HEADERS, 0 if rest else END_HEADERS, stream.id, first)]
        while rest:
            piece, rest = rest[: self.max_frame], rest[self.max_frame :]
            frames.append(_frame(CONTINUATION, 0 if rest else END_HEADERS, stream.id, piece))
        sent = 0
        while True:
            room = min(stream.send_window, self.send_window, self.max_frame, len(body) - sent)
            if room <= 0 and sent < len(body):  # the peer's windows are full: wait for room
                self._send(b"".join(frames))
                frames = []
                self.pump(deadline)
                self._check(stream)
                continue
            piece = body[sent : sent + room]
            sent += len(piece)
            stream.send_window -= len(piece)
            self.send_window -= len(piece)
            ending = END_STREAM if sent >= len(body) else 0
            frames.append(_frame(DATA, ending, stream.id, piece))
            if ending:
                break
        self._send(b"".join(frames))
        return stream

    def _check(self, stream: Http2Stream) -> None:
        if self.lost is not None:
            raise ConnectionLost(self.lost)
        if stream.closed:
            raise ConnectionLost("the stream was reset before its request was sent")

    def consumed(self, stream: Http2Stream | None, size: int) -> None:
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
        if updates:
            self._send(updates)

    def reset(self, stream: Http2Stream) -> None:
        self.streams.pop(stream.id, None)
        self._send(_frame(RST_STREAM, 0, stream.id, struct.pack(">I", CANCEL)))

    def done(self, stream: Http2Stream) -> None:
        """``stream`` has ended both ways: forget it."""
        stream.closed = True
        self.streams.pop(stream.id, None)

    def close(self) -> None:
        """End the connection (the streams still open end as lost). Idempotent."""
        self._lose("the connection was closed")
        self.sock.close()

    def pump(self, deadline: float | None) -> None:
        """Read one frame (a header block with its continuations) and hand it on;
        ``TimeoutError`` once ``deadline`` passes. A connection lost ends every stream."""
        if self.lost is not None:
            for stream in list(self.streams.values()):
                self._end(stream, self.lost)
            raise ConnectionLost(self.lost)
        try:
            kind, flags, stream_id, payload = self._read_frame(deadline)
            if kind == HEADERS:
                payload = self._header_block(flags, stream_id, payload, deadline)
            self._dispatch(kind, flags, stream_id, payload)
        except TimeoutError:
            raise
        except EOFError:
            self._lose("Socket closed")
        except OSError as exc:
            self._lose(exc.strerror or type(exc).__name__)
        except (ConnectionLost, hpack.HPACKError, struct.error, ValueError) as exc:
            self._lose(f"the daemon's HTTP/2 could not be read: {exc}")

    def _send(self, data: bytes) -> None:
        if self.lost is not None or not data:
            return
        try:
            self.sock.sendall(data)
        except OSError as exc:
            self._lose(exc.strerror or type(exc).__name__)

    def _read(self, size: int, deadline: float | None) -> bytes:
        while len(self.buffer) < size:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                raise TimeoutError
            self.sock.settimeout(wait)
            try:
                chunk = self.sock.recv(max(size - len(self.buffer), 1 << 16))
            except TimeoutError:  # socket.timeout is TimeoutError
                raise
            if not chunk:
                raise EOFError
            self.buffer += chunk
        found = bytes(self.buffer[:size])
        del self.buffer[:size]
        return found

    def _read_frame(self, deadline: float | None) -> tuple[int, int, int, bytes]:
        length_type, flags, stream_id = _HEAD.unpack(self._read(9, deadline))
        length, kind = length_type >> 8, length_type & 0xFF
        payload = self._read(length, deadline) if length else b""
        return kind, flags, stream_id & 0x7FFFFFFF, payload

    def _header_block(
        self, flags: int, stream_id: int, payload: bytes, deadline: float | None
    ) -> bytes:
        """A HEADERS frame's block, its CONTINUATION frames joined on; ``END_STREAM`` and
        the block are all the caller needs (padding and priority dropped)."""
        if flags & PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        if flags & PRIORITY:
            payload = payload[5:]
        block = [payload]
        while not flags & END_HEADERS:
            kind, more, continued, piece = self._read_frame(deadline)
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
                stream.events.append(("headers", headers, bool(flags & END_STREAM)))
                if flags & END_STREAM:
                    self.done(stream)
        elif kind == DATA:
            size = len(payload)
            if flags & PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if stream is None:  # a stream we gave up: its data still counts on the connection
                self.consumed(None, size)
                return
            stream.events.append(("data", payload, size))
            if flags & END_STREAM:
                stream.events.append(("end", None, None))
                self.done(stream)
        elif kind == RST_STREAM and stream is not None:
            stream.events.append(("reset", struct.unpack(">I", payload)[0], None))
            self.done(stream)
        elif kind == SETTINGS:
            self._settings(flags, payload)
        elif kind == PING and not flags & ACK:
            self._send(_frame(PING, ACK, 0, payload))
        elif kind == GOAWAY:
            self.last_stream = struct.unpack(">I", payload[:4])[0] & 0x7FFFFFFF
            for taken in [s for i, s in self.streams.items() if i > self.last_stream]:
                self._end(taken, "the server is going away")
        elif kind == WINDOW_UPDATE:
            increment = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
            if stream_id == 0:
                self.send_window += increment
            elif stream is not None:
                stream.send_window += increment
        elif kind == PUSH_PROMISE:
            raise ConnectionLost("the server pushed a stream, which we refused")

    def _settings(self, flags: int, payload: bytes) -> None:
        if flags & ACK:
            return
        for at in range(0, len(payload) - len(payload) % 6, 6):
            key, value = struct.unpack(">HI", payload[at : at + 6])
            if key == INITIAL_WINDOW_SIZE:
                for stream in self.streams.values():
                    stream.send_window += value - self.peer_window
                self.peer_window = value
            elif key == MAX_FRAME_SIZE:
                self.max_frame = value
            elif key == HEADER_TABLE_SIZE:
                self.encoder.header_table_size = value
        self._send(_frame(SETTINGS, ACK, 0, b""))

    def _end(self, stream: Http2Stream, reason: str) -> None:
        stream.events.append(("lost", reason, None))
        self.done(stream)

    def _lose(self, reason: str) -> None:
        if self.lost is not None:
            return
        self.lost = reason
        for stream in list(self.streams.values()):
            self._end(stream, reason)


def _frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return _HEAD.pack(len(payload) << 8 | kind, flags, stream_id) + payload
