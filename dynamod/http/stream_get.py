"""One GET over a plain HTTP/1.1 connection of its own, its body read as it arrives: the
daemon's client for long-lived streams from workers (their engine events).

aiohttp's client costs some 14 KB of Python objects a connection (its parser, its request
and response, their deques), which at 10,000 followed workers is most of the daemon's
memory; a stream needs none of what they are for (pooling, redirects, cookies,
decompression). ``stream_get(url)`` opens a connection, sends GET and reads the
answer's head; ``StreamBody`` is the connection and its body, both in one small object (an
``asyncio.Protocol``), read through the one bounded reader (``bounded.LineReader``: its
``readany`` / ``read_nowait`` are a ``bounded.Chunks``). What it takes from the peer:

* a head (status line and headers) of at most ``HEAD_LIMIT`` bytes (``OversizeError``
  beyond), HTTP/1.0 or 1.1, each header a token, a colon and a value: anything else
  (folded lines, a bare LF, a status that is not three digits) is a ``FramingError``;
* status 200 only: any other, or a connection closed before its head is whole, is a
  ``StreamUnavailableError`` (a ``ConnectionError``: nothing is known of the peer, as for
  a refused connection); redirects are not followed;
* a body delimited by ``Transfer-Encoding: chunked`` (what a worker's aiohttp server
  sends), ``Content-Length``, or the connection's end; a chunk size line of at most
  ``SIZE_LINE`` bytes (``OversizeError``) that is hex digits and extensions, each chunk
  followed by CRLF, trailers within ``HEAD_LIMIT`` bytes; any other transfer coding, or a
  ``Content-Length`` that is not one number, is a ``FramingError``. A chunked or
  ``Content-Length`` body cut short by the connection's end is a
  ``StreamUnavailableError``;
* no ``Content-Encoding`` but ``identity``: the request asks for ``identity``, and a body
  in any other is refused (``bounded.EncodingError``), never inflated.

Memory: what the peer sends waits in one buffer that stops reading (TCP back-pressure) at
``HIGH_WATER`` bytes until the reader takes it. Time is the caller's to bound
(``asyncio.timeout`` around ``stream_get`` and each read), as with aiohttp. Connection
errors (refused, reset) are the ``OSError`` the socket raised.
"""

from __future__ import annotations

import asyncio
import re
from typing import Final, cast
from urllib.parse import urlsplit

from dynamod.errors import InvalidInputError, OversizeError, UpstreamError
from dynamod.http.bounded import EncodingError

HEAD_LIMIT: Final = 16 << 10
"""Bytes of a head (status line and headers, the empty line that ends it included), and
of a chunked body's trailers."""
SIZE_LINE: Final = 1024
"""Bytes of one chunk size line (its extensions included, its CRLF not)."""
HIGH_WATER: Final = 128 << 10
"""Bytes received and not yet taken at which the connection stops reading (aiohttp's
stream reader stops at the same: twice its 64 KiB limit)."""
_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3})(?: [^\r\n]*)?")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?")
# ``StreamBody._left``, when it is not bytes left of the body or of the current chunk:
_DONE: Final = -1
"""The body is whole."""
_UNTIL_CLOSE: Final = -2
"""The connection's end delimits the body."""
_SIZE_DUE: Final = -3
"""A chunk size line is due."""
_CRLF: Final = -4
"""The CRLF after a chunk's data is due."""
_TRAILERS: Final = -5
"""The last chunk came: trailer lines until an empty one."""


class FramingError(UpstreamError):
    """A peer's answer breaks HTTP/1.1 as read here: its head, or the framing of its body."""


class StreamUnavailableError(UpstreamError, ConnectionError):
    """A peer answered another status than 200, or closed its connection before its answer
    was whole: nothing is known of it (retry later), as for a connection refused."""


async def stream_get(url: str) -> StreamBody:
    """``GET url`` on a new connection; its body once the head says 200 (see the module
    docstring for what is refused). The caller closes it."""
    host, port, authority, target = _parts(url)
    request = (
        f"GET {target} HTTP/1.1\r\nHost: {authority}\r\nAccept-Encoding: identity\r\n"
        "Connection: close\r\nUser-Agent: dynamod\r\n\r\n"
    ).encode("ascii")
    loop = asyncio.get_running_loop()
    _, body = await loop.create_connection(lambda: StreamBody(url), host, port)
    try:
        body.send(request)
        await body.read_head()
    except BaseException:
        body.close()
        raise
    return body


def _parts(url: str) -> tuple[str, int, str, str]:
    """Host, port, authority and request target of an ``http://`` URL, each as it can be
    sent; ``InvalidInputError`` else."""
    refused = InvalidInputError(f"{url[:200]!r} is not an http:// URL with a host and a "
                                "port; streams are read over plain HTTP/1.1")  # fmt: skip
    try:
        parts = urlsplit(url)
        port = parts.port or 80
    except ValueError:
        raise refused from None
    if parts.scheme != "http" or not parts.hostname:
        raise refused
    authority = parts.netloc.rpartition("@")[2]
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    for sent in (authority, target):
        if not sent.isascii() or not sent.isprintable() or " " in sent:
            raise InvalidInputError(f"{url[:200]!r} cannot be sent as it is (not ASCII, or "
                                    "a space or control character)")  # fmt: skip
    return parts.hostname, port, authority, target


class StreamBody(asyncio.Protocol):
    """One connection and its answer's body; see the module docstring. ``readany`` and
    ``read_nowait`` give the body's bytes as they arrive, framing removed; ``b""`` from
    ``readany`` is its end. Errors are raised by the read that meets them."""

    __slots__ = ("_ended", "_failed", "_left", "_paused", "_received", "_trailer",
                 "_transport", "_url", "_waiter", "chunked")  # fmt: skip

    def __init__(self, url: str) -> None:
        self._url = url
        self._transport: asyncio.Transport | None = None
        self._received = bytearray()
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False
        """The peer closed (or the connection was lost)."""
        self._failed: Exception | None = None
        self._paused = False
        self.chunked = False
        self._left = _UNTIL_CLOSE
        """Bytes left of the body (``Content-Length``) or of the current chunk, or what is
        due next (``_DONE``, ``_UNTIL_CLOSE``, ``_SIZE_DUE``, ``_CRLF``, ``_TRAILERS``)."""
        self._trailer = 0
        """Bytes of trailers read (a chunked body's end)."""

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A read-write transport: asyncio's, or uvloop's (which does not subclass it).
        self._transport = cast("asyncio.Transport", transport)

    def data_received(self, data: bytes) -> None:
        self._received += data
        if len(self._received) >= HIGH_WATER and not self._paused and self._transport:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._ended = True
        self._wake()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended = True
        self._failed = exc
        self._wake()

    # -- the reader's side

    @property
    def buffered(self) -> int:
        """Bytes received and not yet read: at most ``HIGH_WATER`` and one read of the
        socket (reading stops there until the reader takes them)."""
        return len(self._received)

    def send(self, data: bytes) -> None:
        assert self._transport is not None
        self._transport.write(data)

    def close(self) -> None:
        """Close the connection (what was not read is dropped)."""
        if self._transport is not None:
            self._transport.abort()

    async def read_head(self) -> None:
        """Wait for the answer's head and take it: status 200, and how its body ends."""
        while (end := self._received.find(b"\r\n\r\n", 0, HEAD_LIMIT)) < 0:
            if len(self._received) >= HEAD_LIMIT:
                raise OversizeError(f"the head of the answer of {self._url}", HEAD_LIMIT)
            if self._ended:
                self._lost(f"{self._url} closed its connection before it answered")
            await self._wait()
        head = bytes(self._received[:end])
        del self._received[: end + 4]
        self._resume()
        status_line, *lines = head.split(b"\r\n")
        status = _STATUS.fullmatch(status_line)
        if status is None:
            raise FramingError(f"{self._url} answered {status_line[:80]!r}, not an HTTP/1.1 "
                               "status line")  # fmt: skip
        if status[1] != b"200":
            raise StreamUnavailableError(f"{self._url} answered {status[1].decode()}, not 200")
        self._frame(self._headers(lines))

    def _headers(self, lines: list[bytes]) -> dict[bytes, list[bytes]]:
        found: dict[bytes, list[bytes]] = {}
        for line in lines:
            name, colon, value = line.partition(b":")
            if not colon or _TOKEN.fullmatch(name) is None or b"\r" in value or b"\n" in value:
                raise FramingError(f"{self._url} sent a header line {line[:80]!r} that is "
                                   "not a name, a colon and a value")  # fmt: skip
            found.setdefault(name.lower(), []).append(value.strip(b" \t"))
        return found

    def _frame(self, headers: dict[bytes, list[bytes]]) -> None:
        """How the body ends, from its headers; refused codings raise."""
        coding = b",".join(headers.get(b"content-encoding", [])).strip().lower()
        if coding not in (b"", b"identity"):
            raise EncodingError(f"the answer of {self._url} is in Content-Encoding "
                                f"{coding[:40].decode('latin-1')!r}; it is read as sent "
                                "(identity)")  # fmt: skip
        transfer = headers.get(b"transfer-encoding")
        if transfer is not None:
            codings = b",".join(transfer)
            if codings.strip().lower() != b"chunked":
                raise FramingError(f"the answer of {self._url} has Transfer-Encoding "
                                   f"{codings[:40]!r}; only chunked is read")  # fmt: skip
            self.chunked, self._left = True, _SIZE_DUE
            return
        values = headers.get(b"content-length", [])
        lengths = {v.strip() for value in values for v in value.split(b",")}
        if len(lengths) > 1 or any(not v.isdigit() or len(v) > 18 for v in lengths):
            raise FramingError(f"the answer of {self._url} has Content-Length "
                               f"{sorted(lengths)[:3]!r}, not one number")  # fmt: skip
        if lengths:
            self._left = int(lengths.pop()) or _DONE

    async def readany(self) -> bytes:
        """Body bytes that arrived, waiting for some; ``b""`` at the body's end."""
        while not (data := self.read_nowait()):
            if self._left == _DONE:
                return b""
            if self._ended:
                if self._left == _UNTIL_CLOSE and self._failed is None:
                    self._left = _DONE
                    return b""
                self._lost(f"{self._url} closed its connection in the middle of its answer")
            await self._wait()
        return data

    def read_nowait(self) -> bytes:
        """Body bytes that arrived, without waiting (``b""``: none yet); framing errors
        raise here."""
        out = bytearray()
        while self._received and self._left != _DONE and self._take_into(out):
            pass
        self._resume()
        return bytes(out)

    def _take_into(self, out: bytearray) -> bool:
        """Move the next piece of what was received (data into ``out``, framing dropped);
        False when what is there does not hold the next piece whole."""
        got, left = self._received, self._left
        if left == _UNTIL_CLOSE:
            out += got
            got.clear()
        elif left > 0:
            size = min(left, len(got))
            out += got[:size]
            del got[:size]
            self._left = left - size or (_CRLF if self.chunked else _DONE)
        elif left == _CRLF:
            if len(got) < 2:
                return False
            if got[:2] != b"\r\n":
                raise FramingError(f"{self._url} sent {bytes(got[:8])!r} where the end of a chunk "
                                   "(CRLF) was due")  # fmt: skip
            del got[:2]
            self._left = _SIZE_DUE
        elif left == _SIZE_DUE:
            return self._take_size()
        else:
            return self._take_trailer()
        return True

    def _take_size(self) -> bool:
        got = self._received
        end = got.find(b"\r\n", 0, SIZE_LINE + 2)
        if end < 0:
            if len(got) > SIZE_LINE:
                raise OversizeError(f"a chunk size line of {self._url}", SIZE_LINE)
            return False
        line = bytes(got[:end])
        size = _SIZE.fullmatch(line)
        if size is None:
            raise FramingError(f"{self._url} sent {line[:40]!r} where a chunk size was due")
        del got[: end + 2]
        self._left = int(size[1], 16) or _TRAILERS  # the last chunk: trailers, an empty line
        return True

    def _take_trailer(self) -> bool:
        """One trailer line (dropped); the empty line after them ends the body."""
        got = self._received
        end = got.find(b"\r\n", 0, HEAD_LIMIT + 2 - self._trailer)
        if end < 0:
            if self._trailer + len(got) > HEAD_LIMIT:
                raise OversizeError(f"the trailers of {self._url}", HEAD_LIMIT)
            return False
        del got[: end + 2]
        self._trailer += end + 2
        if end == 0:
            self._left = _DONE
        return True

    # -- waiting

    def _lost(self, message: str) -> None:
        if self._failed is not None:
            raise self._failed
        raise StreamUnavailableError(message)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _resume(self) -> None:
        if self._paused and len(self._received) < HIGH_WATER // 2 and self._transport:
            self._paused = False
            self._transport.resume_reading()
