"""The one bounded reader for bytes from outside: every body and every line a worker or an
upstream server sends is read through here, with a byte budget.

aiohttp reads whatever a peer sends: ``response.read()`` takes a body of any size into
memory, and a stream reader's ``readuntil`` raises different exceptions for a long line
depending on where it was cut (``ValueError``, ``LineTooLong``). Both are the peer's
choice, not ours. ``read_body`` reads at most ``limit`` bytes and refuses the rest;
``LineReader`` yields lines of at most ``limit`` bytes and refuses a longer one. Both raise
``OversizeError`` (naming what was read and the limit) and never hold more than the
limit plus one network chunk. Time is the caller's to bound (``asyncio.timeout``, the
session's timeouts); what a refusal costs is the caller's policy (``dynamod.boundary``:
that peer's connection, and a mark on the worker).
"""

from __future__ import annotations

from aiohttp import ClientResponse, StreamReader

from dynamod.errors import OversizeError


async def read_body(response: ClientResponse, limit: int, what: str) -> bytes:
    """The whole body of ``response``, at most ``limit`` bytes; ``OversizeError`` beyond.

    A ``Content-Length`` over the limit is refused before a byte of the body is read."""
    announced = response.content_length
    if announced is not None and announced > limit:
        raise OversizeError(f"{what} ({announced} bytes announced)", limit)
    body = bytearray()
    async for chunk in response.content.iter_any():
        body += chunk
        if len(body) > limit:
            raise OversizeError(what, limit)
    return bytes(body)


class LineReader:
    """Newline-terminated lines from ``content``, each at most ``limit`` bytes (newline
    included); ``OversizeError`` for a longer one, which ends the reader's use."""

    def __init__(self, content: StreamReader, limit: int, what: str) -> None:
        self._content = content
        self._limit = limit
        self._what = what
        self._buffer = bytearray()
        self._scanned = 0

    async def next_line(self) -> bytes | None:
        """The next whole line, or None at the end of the stream (a last line without its
        newline is returned as it is)."""
        while True:
            line = self._buffered_line()
            if line is not None:
                return line
            chunk = await self._content.readany()
            if not chunk:
                return self._take(len(self._buffer)) if self._buffer else None
            self._buffer += chunk

    def arrived(self) -> bytes | None:
        """The next whole line if it has already been received, taken without waiting;
        None when it has not. For a caller whose wait for ``next_line`` timed out: on a
        starved event loop the line may have arrived in time and only been read late."""
        self._buffer += self._content.read_nowait()
        return self._buffered_line()

    def _buffered_line(self) -> bytes | None:
        """A whole line from the buffer, or None; a line growing past the limit raises."""
        end = self._buffer.find(b"\n", self._scanned)
        if end >= 0:
            return self._take(end + 1)
        self._scanned = len(self._buffer)
        if self._scanned > self._limit:
            raise OversizeError(f"a line of {self._what}", self._limit)
        return None

    def _take(self, size: int) -> bytes:
        if size > self._limit:
            raise OversizeError(f"a line of {self._what}", self._limit)
        line = bytes(self._buffer[:size])
        del self._buffer[:size]
        self._scanned = 0
        return line
