"""Serving an aiohttp application: the one way the worker's two servers and the daemon's
front are bound, with the same bounds on what a client may do.

Every server gets ``HttpLimits``:

* a request's head (request line and headers) must arrive within ``head_timeout`` of its
  first byte (of the connection, for the first request); a client that dawdles gets
  ``408`` and the connection is closed: a byte-a-second client cannot hold a connection;
* its body must arrive within ``body_timeout`` (``408`` in the surface's own error shape)
  and may not exceed the application's ``client_max_size`` (``413``, likewise);
* an idle keep-alive connection is closed after ``idle_timeout``;
* the request line, each header and the number of headers are bounded by aiohttp's parser
  (8190 bytes, 8190 bytes, 128), and a malformed request is answered ``400`` and logged as
  one warning line, not an error with a traceback.

The body is read once, by a middleware, before any handler runs; ``request.read()`` then
returns it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from dynamod.errors import ListenError
from dynamod.http.limits import HttpLimits

log = logging.getLogger(__name__)

Refuse = Callable[[int, str], web.Response]
"""Renders a refusal (status, message) in a surface's own error shape."""
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def listen(host: str, port: int, what: str = "http") -> socket.socket:
    """A listening TCP socket on ``host:port`` (0 picks a port). Binding apart from serving
    lets a process fail at once on a busy port (``ListenError``), before it changed
    anything."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family, backlog=1024)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise ListenError(f"cannot listen on {what} {host}:{port}: {reason}") from None


async def serve_app(
    stack: contextlib.AsyncExitStack,
    app: web.Application,
    listener: socket.socket,
    refuse: Refuse,
    limits: HttpLimits,
) -> tuple[str, int]:
    """Serve ``app`` on ``listener`` with ``limits``; cleaned up when ``stack`` closes.
    Returns the bound host and port.

    Handlers are cancelled when their client disconnects (``handler_cancellation``): a
    stream stops at once instead of at its next write."""
    app.middlewares.insert(0, _body_in_time(limits.body_timeout, refuse))
    runner = _Runner(
        app,
        limits.head_timeout,
        access_log=None,
        shutdown_timeout=1.0,
        handle_signals=False,
        handler_cancellation=True,
        keepalive_timeout=limits.idle_timeout,
        logger=_ServerLog(logging.getLogger("aiohttp.server"), {}),
    )
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    await web.SockSite(runner, listener).start()
    host, port = listener.getsockname()[:2]
    return str(host), int(port)


def url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _body_in_time(timeout: float, refuse: Refuse) -> Callable[..., Awaitable[Any]]:
    @web.middleware
    async def read_body(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.can_read_body and request.content.is_eof():
            # The whole body is in already (a small one comes with its head): reading it
            # cannot wait, so no deadline is armed; the size bound is read()'s own.
            try:
                await request.read()
            except web.HTTPRequestEntityTooLarge:
                return _too_large(request, refuse)
        elif request.can_read_body:
            try:
                async with asyncio.timeout(timeout):
                    await request.read()
            except TimeoutError:
                return refuse(408, f"the request body did not arrive within {timeout:g} s")
            except web.HTTPRequestEntityTooLarge:
                return _too_large(request, refuse)
        return await handler(request)

    return read_body


def _too_large(request: web.Request, refuse: Refuse) -> web.StreamResponse:
    limit = request.client_max_size
    return refuse(413, f"the request body is over the limit of {limit} bytes")


class _ServerLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server log, with a malformed request (the client's fault) as one warning
    line instead of an error and a traceback: any client could flood the log otherwise."""

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kw: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            first = str(exc_info.message).strip().splitlines()[0] if exc_info.message else ""
            self.warning("malformed HTTP request from %s: %s", args[0] if args else "?", first)
            return
        super().exception(msg, *args, exc_info=exc_info, **kw)


class _Runner(web.AppRunner):
    """An ``AppRunner`` whose connections have a deadline for each request's head."""

    def __init__(self, app: web.Application, head_timeout: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._head_timeout = head_timeout

    async def _make_server(self) -> Any:
        return _Server(await super()._make_server(), self._head_timeout)


class _Server:
    """aiohttp's ``Server`` (the protocol factory the sites serve), each connection's
    protocol wrapped in ``_HeadDeadline``; everything else is the server's own."""

    def __init__(self, server: Server, head_timeout: float) -> None:
        self._server = server
        self._head_timeout = head_timeout

    def __call__(self) -> _HeadDeadline:
        return _HeadDeadline(self._server(), self._head_timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


class _HeadDeadline(asyncio.Protocol):
    """Wraps aiohttp's per-connection protocol: between a request's first byte and its
    last header line at most ``timeout`` seconds may pass; then the client gets ``408``
    and the connection is closed. aiohttp has keep-alive and body bounds of its own
    making, but nothing for a head that never ends."""

    def __init__(self, handler: RequestHandler, timeout: float) -> None:
        self._handler = handler
        self._timeout = timeout
        self._deadline: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._handler.connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        self._handler.data_received(data)
        if self._head_done():
            self._disarm()
        elif self._deadline is None:
            self._arm()  # the first bytes of the next request on a kept-alive connection

    def eof_received(self) -> None:
        self._handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._handler.connection_lost(exc)

    def pause_writing(self) -> None:
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._handler.resume_writing()

    def _head_done(self) -> bool:
        # aiohttp queues a request once its head is parsed, and marks it in progress
        # while a handler runs; private names, pinned by tests/hostile.
        handler: Any = self._handler
        return bool(handler._messages) or bool(handler._request_in_progress)

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(self._timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        transport = self._transport
        if self._head_done() or transport is None or transport.is_closing():
            return
        peer = transport.get_extra_info("peername")
        log.warning(
            "closing a connection from %s: no complete request within %g s", peer, self._timeout
        )
        transport.write(
            b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
        )
        transport.close()
