"""Server-sent events from a worker or an upstream server, one whole event at a time, each
bounded in bytes: read through the one bounded reader (``bounded.LineReader``).

A stream may run long in total (a long generation), but no single event may be huge:
``EventReader(content, limit, what).next_event()`` returns the next event as its lines
up to and including the blank line that ends it (``\\n`` or ``\\r\\n`` endings, passed on
as they came), None at the end of the stream, and raises ``OversizeError`` for an event
over ``limit`` bytes, which ends the reader's use. A stream that ends in the middle of an
event returns None too, and ``partial`` says how many bytes of that last event were
read and dropped: a relay never passes half an event on (half a JSON object glued to the
next event would be garbage to every client).

``OpenStreams`` holds the streams a server is relaying (the daemon's front, the
``--engine openai`` worker); ``cut(message)`` marks each as cut and closes its upstream
connection, which wakes its pending read: the stream's own task then writes its ending
(an error event with code ``shutting_down``, and ``[DONE]``), so nothing writes to a
response from outside the task serving it. For the end of a grace period: a client then
knows its answer is incomplete. What each stream holds for a client that does not read
is a claim on the daemon's one memory budget (``memory.MemoryBudget``), moved at each
event (``make_room``, ``OpenStream.holding``): past the budget the largest holder pays,
and when that is a stream its client's connection is aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from aiohttp import ClientResponse, StreamReader

from dynamod.errors import MemoryBudgetError, OversizeError
from dynamod.http.bounded import LineReader
from dynamod.http.memory import Claim, MemoryBudget

_BLANK = (b"\n", b"\r\n")


class EventReader:
    """Whole SSE events from ``content``, each at most ``limit`` bytes; see the module
    docstring. ``what`` names the stream in errors (``the stream of worker 1a2b``)."""

    def __init__(self, content: StreamReader, limit: int, what: str) -> None:
        self._lines = LineReader(content, limit, what)
        self._limit = limit
        self._what = what
        self.partial = 0
        """Bytes of an event the stream ended in the middle of (0: it ended cleanly)."""

    async def next_event(self) -> bytes | None:
        """The next whole event, or None at the end of the stream (see ``partial``)."""
        lines: list[bytes] = []
        size = 0
        while True:
            try:
                line = await self._lines.next_line()
            except OversizeError:
                raise self._oversize() from None
            if line is None or not line.endswith(b"\n"):
                self.partial = size + (len(line) if line else 0)
                return None
            if line in _BLANK and not lines:
                continue  # blank lines between events carry nothing
            size += len(line)
            if size > self._limit:
                raise self._oversize()
            lines.append(line)
            if line in _BLANK:
                return b"".join(lines)

    def _oversize(self) -> OversizeError:
        return OversizeError(f"an event of {self._what}", self._limit)


DONE_EVENT = b"data: [DONE]\n\n"
_DONE = (b"data: [DONE]", b"data:[DONE]")


def is_done(event: bytes) -> bool:
    """Whether ``event`` is the ``[DONE]`` that ends an OpenAI stream."""
    return event.rstrip() in _DONE


@dataclass(eq=False)
class OpenStream:
    """One stream being relayed: its upstream answer, and why it was cut, once it was;
    ``client``: the client's transport once the answer started; ``pending``: bytes of the
    event being written to it; ``claim``: what it holds, on the memory budget."""

    upstream: ClientResponse
    claim: Claim
    cut: str | None = None
    client: asyncio.WriteTransport | None = None
    pending: int = 0

    @property
    def held(self) -> int:
        """Bytes this stream holds for its client: the event being written, and what
        waits in the client's socket buffer (a client that does not read)."""
        client = self.client
        waiting = client.get_write_buffer_size() if client and not client.is_closing() else 0
        return self.pending + waiting

    def holding(self, pending: int) -> bool:
        """``pending`` bytes of an event about to be written (0: written): what the stream
        holds now, on its claim; False when the budget made it pay (its client was
        aborted)."""
        self.pending = pending
        try:
            self.claim.resize(self.held)
        except MemoryBudgetError:
            return False
        return True

    def drop(self, error: MemoryBudgetError) -> None:
        """The budget made this stream pay (it logged why): the client's connection is
        aborted (its buffered bytes are freed); the stream's own task sees it at its next
        write."""
        self.pending = 0
        if self.client is not None:
            self.client.abort()


@dataclass
class OpenStreams:
    """The streams being relayed; see the module docstring. ``budget``: the memory budget
    what they hold for their clients is a claim on (the daemon's one)."""

    budget: MemoryBudget = field(default_factory=MemoryBudget)
    _open: set[OpenStream] = field(default_factory=set)

    def make_room(self, stream: OpenStream, size: int) -> bool:
        """Before ``stream`` writes an event of ``size`` bytes: its claim grows by it. Past
        the budget the largest holder pays; False when that is ``stream`` itself (its
        client is aborted, the caller stops)."""
        return stream.holding(size)

    @contextlib.contextmanager
    def opened(self, upstream: ClientResponse, name: str = "a stream") -> Iterator[OpenStream]:
        with self.budget.claim(f"{name} to a client") as claim:
            stream = OpenStream(upstream, claim)
            claim.stop = stream.drop
            self._open.add(stream)
            try:
                yield stream
            finally:
                self._open.discard(stream)

    def cut(self, message: str) -> int:
        """Cut every open stream (module docstring); how many there were."""
        for stream in self._open:
            stream.cut = message
            stream.upstream.close()
        return len(self._open)
