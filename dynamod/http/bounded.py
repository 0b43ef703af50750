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
that peer's connection, and a mark on the worker). ``inflate`` decodes a compressed body
in slices, within a limit of its own, giving the loop back between them.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Final, Protocol

from aiohttp import ClientResponse

from dynamod.errors import OversizeError, UpstreamError
from dynamod.http.memory import Claim

INFLATE_SLICE: Final = 256 << 10
"""Bytes one step of ``inflate`` writes before it gives the event loop back (a
millisecond of zlib): a compressed body expands a thousandfold, and inflated in one call
a 64 KiB chunk becomes 64 MiB in one stall of the loop."""
_WBITS: Final = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": 0}


async def read_body(
    response: ClientResponse, limit: int, what: str, claim: Claim | None = None
) -> bytes:
    """The whole body of ``response``, at most ``limit`` bytes; ``OversizeError`` beyond.

    A ``Content-Length`` over the limit is refused before a byte of the body is read.
    ``claim``: each chunk is held on it (the daemon's memory budget, ``memory.py``); made
    to pay, the response is closed and ``MemoryBudgetError`` raised."""
    announced = response.content_length
    if announced is not None and announced > limit:
        raise OversizeError(f"{what} ({announced} bytes announced)", limit)
    chunks: list[bytes] = []
    size = 0
    if claim is not None:
        claim.stop = lambda _: response.close()
    try:
        async for chunk in response.content.iter_any():
            size += len(chunk)
            chunks.append(chunk)
            if claim is not None:
                claim.add(len(chunk))
            if size > limit:
                raise OversizeError(what, limit)
    except Exception:
        if claim is not None and claim.refused is not None:
            raise claim.refused from None  # its read was woken by the close
        raise
    if len(chunks) == 1:
        return chunks[0]  # a small answer comes in one chunk: passed on as it is
    if claim is not None:
        claim.add(size)  # the joined copy, while both live
    whole = b"".join(chunks)
    if claim is not None:
        claim.add(-size)
    return whole


class Chunks(Protocol):
    """Where ``LineReader`` reads from: aiohttp's ``StreamReader`` (a response's content),
    or ``stream_get.StreamBody`` (a stream on a connection of its own)."""

    async def readany(self) -> bytes:
        """Bytes that arrived, waiting for some; ``b""`` at the end."""
        ...

    def read_nowait(self) -> bytes:
        """Bytes that arrived, without waiting; ``b""`` when none have."""
        ...


class LineReader:
    """Newline-terminated lines from ``content``, each at most ``limit`` bytes (newline
    included); ``OversizeError`` for a longer one, which ends the reader's use. ``claim``:
    what waits in its buffer is held on it (``memory.py``), moved once per chunk read; made
    to pay, the reader raises ``MemoryBudgetError`` (its owner closes the connection:
    ``claim.stop``)."""

    __slots__ = ("_buffer", "_claim", "_content", "_limit", "_scanned", "_what")

    def __init__(self, content: Chunks, limit: int, what: str, claim: Claim | None = None) -> None:
        self._content = content
        self._limit = limit
        self._what = what
        self._buffer = bytearray()
        self._scanned = 0
        self._claim = claim

    async def next_line(self) -> bytes | None:
        """The next whole line, or None at the end of the stream (a last line without its
        newline is returned as it is)."""
        while True:
            line = self._buffered_line()
            if line is not None:
                return line
            self._held()
            try:
                chunk = await self._content.readany()
            except Exception:
                self._held()  # its refusal, when that is why the connection was closed
                raise
            self._buffer += chunk
            self._held()
            if not chunk:
                return self._take(len(self._buffer)) if self._buffer else None

    def arrived(self) -> bytes | None:
        """The next whole line if it has already been received, taken without waiting;
        None when it has not. For a caller whose wait for ``next_line`` timed out: on a
        starved event loop the line may have arrived in time and only been read late."""
        self._buffer += self._content.read_nowait()
        self._held()
        return self._buffered_line()

    def _held(self) -> None:
        if self._claim is not None:
            self._claim.resize(len(self._buffer))

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


class EncodingError(UpstreamError):
    """A body in a ``Content-Encoding`` that cannot be read: unknown, or corrupt."""


async def inflate(
    body: bytes, encoding: str, limit: int, what: str, claim: Claim | None = None
) -> bytes:
    """``body`` decoded from its ``Content-Encoding`` (``gzip`` or ``deflate``; ``identity``
    or none: as it is), at most ``limit`` bytes; ``OversizeError`` beyond, ``EncodingError``
    for an encoding not read here or a corrupt body. Decoded ``INFLATE_SLICE`` bytes at a
    time, the loop given back between slices: a bomb costs the loop a millisecond a slice,
    and memory its limit. ``claim``: each slice is held on it, as ``read_body``'s chunks."""
    coding = encoding.strip().lower()
    if coding in ("", "identity"):
        return body
    wbits = _WBITS.get(coding)
    if wbits is None:
        raise EncodingError(f"{what} is in Content-Encoding {coding[:40]!r}; the front reads "
                            "gzip, deflate or identity")  # fmt: skip
    if coding == "deflate":  # zlib-wrapped, as the RFC says, or raw, as some servers send
        wbits = zlib.MAX_WBITS if body[:1] == b"\x78" else -zlib.MAX_WBITS
    decoder = zlib.decompressobj(wbits)
    out = bytearray()
    pending = body
    try:
        while pending:
            size = len(out)
            out += decoder.decompress(pending, INFLATE_SLICE)
            if claim is not None:
                claim.add(len(out) - size)
            pending = decoder.unconsumed_tail
            if len(out) > limit:
                raise OversizeError(f"{what} (inflated)", limit)
            if decoder.eof:
                break
            await asyncio.sleep(0)
        out += decoder.flush(limit + 1 - len(out))
    except zlib.error as exc:
        raise EncodingError(f"{what} is not valid {coding}: {exc}") from None
    if len(out) > limit:
        raise OversizeError(f"{what} (inflated)", limit)
    return bytes(out)
