"""``LightClient``: the calls dynamoctl's commands in loops make (``workers ls``, ``taints
add``; ``dynamoctl.direct``), over our own HTTP/2 on a blocking socket
(``dynamod.client.http2``) instead of gRPC's, with no event loop: importing gRPC and asyncio
costs a CLI run about a third of its time.

gRPC over HTTP/2 for unary and server-streaming calls is small: a POST to
``/dynamo.v1.Service/Method`` with ``content-type: application/grpc``, ``te: trailers``,
``grpc-timeout`` (the call's deadline) and the token as ``authorization: Bearer …``; each
message framed as a compressed flag, a 4-byte big-endian length and the protobuf; the
answer's messages likewise, then trailers with ``grpc-status``, ``grpc-message`` and the
daemon's error (``dynamod.api.error_status``, decoded as ``AsyncClient`` decodes it).

The calls are coroutines, as ``AsyncClient``'s, so one session body runs on either; these
never suspend (their waits are the socket's), so ``dynamoctl.session.run_light`` runs a
body to its end without a loop.

What the user sees must be what ``AsyncClient`` would have shown, so ``open`` says False
wherever this client is not sure, and ``AsyncClient`` then makes the calls instead: an
endpoint that is not a unix socket path or ``host:port``, a proxy in the environment (gRPC
would use it), TLS without ``--cacert`` (gRPC's own roots) or on a unix socket, and above
all a connection that cannot be made — refused, no socket, a TLS handshake that fails, a
peer that is not HTTP/2 — which gRPC then reports in its own words (nothing was sent yet).
Once connected, a status is rebuilt into the daemon's own error class, a deadline that
passes is ``AnswerTimeoutError`` and a connection lost is ``UnreachableError``, as there. A
connection that cannot be made within the timeout is ``UnreachableError`` with gRPC's words
for it (``Deadline Exceeded``).
"""

from __future__ import annotations

import base64
import os
import socket
import struct
import time
from collections.abc import AsyncGenerator, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal

from dynamod.api import convert
from dynamod.api.error_status import CODES
from dynamod.api.v1 import dynamo_pb2 as pb
from dynamod.client import http2
from dynamod.client.endpoint import (
    UPDATE_WAIT,
    Credentials,
    call_error,
    completed,
    late,
    target_of,
    unreachable,
)
from dynamod.errors import DynamoError
from dynamod.records import ModelCard
from dynamod.results import ID_PREFIX, UpdateOutcome, WorkerInfo, WorkerPage

if TYPE_CHECKING:
    import ssl
    from collections.abc import Sequence

    from dynamod.pool_results import PolicyInfo
    from dynamod.taints import TaintUpdate
    from dynamod.targets import Target

MAX_ANSWER = 64 * 1024 * 1024
"""The largest message taken, as ``AsyncClient``'s channel (``CHANNEL_OPTIONS``)."""
PROXIES = ("grpc_proxy", "https_proxy", "http_proxy")
USER_AGENT = "dynamod-light-client"
# gRPC's codes for an HTTP status that is not 200 (its http-grpc-status-mapping.md).
HTTP_CODES = {400: "INTERNAL", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
              404: "UNIMPLEMENTED", 429: "UNAVAILABLE", 502: "UNAVAILABLE",
              503: "UNAVAILABLE", 504: "UNAVAILABLE"}  # fmt: skip
# gRPC's codes for a stream reset (RST_STREAM's code); any other is INTERNAL.
RESET_CODES = {7: "UNAVAILABLE", 8: "CANCELLED", 11: "RESOURCE_EXHAUSTED", 12: "PERMISSION_DENIED"}


class LightClient:
    """The calls of ``AsyncClient`` that ``workers ls`` and ``taints add`` make, alike in
    arguments, results and errors: ``open`` it, then ``async with client`` (which closes
    it), or ``close`` it."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        credentials: Credentials | None = None,
        timeout: float | None = None,
    ) -> None:
        dial = completed(endpoint, credentials, timeout)
        self.endpoint = dial.endpoint
        self.timeout = dial.timeout
        self._credentials = dial.credentials
        self._metadata = dial.credentials.metadata()  # what every call carries
        self._connection: http2.Http2Connection | None = None
        target = target_of(self.endpoint)
        tls = self._credentials.tls or self._credentials.ca is not None
        authority = "localhost" if isinstance(_address(target), str) else target
        self._fixed = [(":method", "POST"), (":scheme", "https" if tls else "http"),
                       (":authority", authority)]  # fmt: skip
        """The headers every call of this client starts with."""

    def open(self) -> bool:
        """Connect; False where ``AsyncClient`` is to make the calls (nothing was sent).
        ``UnreachableError`` when the connection is not made within the timeout."""
        address = _address(target_of(self.endpoint))
        if address is None or (isinstance(address, tuple) and _proxied()):
            return False
        context = _tls(self._credentials)
        if context is False or (context is not None and isinstance(address, str)):
            return False  # TLS on a unix socket: the name gRPC checks is its own choice
        deadline = time.monotonic() + self.timeout
        sock = None
        try:
            if isinstance(address, str):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(self.timeout)
                sock.connect(address)
            else:
                sock = socket.create_connection(address, timeout=self.timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if context is not None:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                sock = context.wrap_socket(sock, server_hostname=address[0])
            self._connection = http2.Http2Connection.open(sock, deadline)
            return True
        except TimeoutError:
            _discard(sock)
            raise unreachable(self.endpoint, "Deadline Exceeded") from None
        except (OSError, EOFError, http2.ConnectionLost):  # gRPC says why in its words
            _discard(sock)
            return False

    async def __aenter__(self) -> LightClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection. Idempotent."""
        if self._connection is not None:
            self._connection.close()

    async def list_workers(
        self,
        *,
        model: str = "",
        selector: str = "",
        namespace: str = "",
        component: str = "",
        endpoint: str = "",
        fields: Iterable[str] = (),
    ) -> tuple[list[WorkerInfo], int]:
        """``AsyncClient.list_workers``."""
        request = convert.list_request(model, selector, namespace, component, endpoint, fields)
        reply = self._unary("WorkerService", "ListWorkers", request, pb.ListWorkersResponse)
        return convert.workers_from_pb(reply.workers), reply.revision

    async def stream_workers(
        self,
        *,
        model: str = "",
        selector: str = "",
        namespace: str = "",
        component: str = "",
        endpoint: str = "",
        fields: Iterable[str] = (),
        page_size: int = 0,
    ) -> AsyncGenerator[WorkerPage, None]:
        """``AsyncClient.stream_workers``: pages as they come; the deadline covers them all."""
        request = convert.list_request(model, selector, namespace, component, endpoint, fields)
        request.page_size = page_size
        cards: dict[str, ModelCard] = {}
        call = self._call("WorkerService", "StreamWorkers", request, pb.ListWorkersResponse,
                          deadline=self.timeout)  # fmt: skip
        for reply in call:
            workers = [convert.worker_from_pb(m, cards) for m in reply.workers]
            yield WorkerPage(workers, reply.revision, reply.id_prefix)

    async def id_prefix(self) -> int:
        """``AsyncClient.id_prefix``."""
        request = pb.ListWorkersRequest(fields=["id"], prefix_only=True)
        reply = self._unary("WorkerService", "ListWorkers", request, pb.ListWorkersResponse)
        return max(int(reply.id_prefix), ID_PREFIX)

    async def update_taints(
        self, update: TaintUpdate, target: Target, *, dry_run: bool = False
    ) -> list[UpdateOutcome]:
        """``AsyncClient.update_taints`` (its deadline: the timeout plus ``UPDATE_WAIT``)."""
        request = convert.update_request(update, target, dry_run)
        reply = self._unary("TaintService", "UpdateTaints", request, pb.UpdateTaintsResponse,
                            wait=UPDATE_WAIT)  # fmt: skip
        return [convert.change_from_pb(c) for c in reply.results]

    async def stream_update_taints(
        self, update: TaintUpdate, target: Target, *, dry_run: bool = False
    ) -> AsyncGenerator[UpdateOutcome, None]:
        """``AsyncClient.stream_update_taints``: no deadline, each outcome awaited at most
        the timeout plus ``UPDATE_WAIT``."""
        request = convert.update_request(update, target, dry_run)
        call = self._call("TaintService", "StreamUpdateTaints", request, pb.TaintChange,
                          idle=self.timeout + UPDATE_WAIT)  # fmt: skip
        for message in call:
            yield convert.change_from_pb(message)

    async def list_policies(self) -> list[PolicyInfo]:
        """``AsyncClient.list_policies``."""
        request = pb.ListPoliciesRequest()
        reply = self._unary("PoolService", "ListPolicies", request, pb.ListPoliciesResponse)
        from dynamod.api import pool_convert

        return [pool_convert.policy_from_pb(p) for p in reply.policies]

    # Calls.

    def _unary(
        self, service: str, method: str, request: Any, reply: Any, *, wait: float = 0.0
    ) -> Any:
        """One unary call, its deadline ``timeout`` plus the daemon's own ``wait``."""
        answers = list(self._call(service, method, request, reply, deadline=self.timeout + wait))
        if len(answers) != 1:
            raise self._failure("INTERNAL", f"{len(answers)} answers to a unary call", (), None)
        return answers[0]

    def _call(
        self,
        service: str,
        method: str,
        request: Any,
        reply: Any,
        *,
        deadline: float | None = None,
        idle: float | None = None,
    ) -> Iterator[Any]:
        """The answers to one call, its errors as ours: the whole within ``deadline``
        seconds, each answer within ``idle``; cancelled (``RST_STREAM``) when left."""
        connection = self._connected(deadline)
        until = None if deadline is None else time.monotonic() + deadline
        path = f"/{pb.DESCRIPTOR.package}.{service}/{method}"
        body = request.SerializeToString()
        framed = struct.pack(">BI", 0, len(body)) + body
        try:
            stream = connection.request(
                self._headers(path, deadline), framed, self._metadata, until
            )
        except TimeoutError:
            raise late(self.endpoint, deadline or self.timeout) from None
        except http2.ConnectionLost as exc:
            raise self._failure("UNAVAILABLE", str(exc), (), deadline) from None
        answer = _Answer()
        try:
            while answer.code is None:
                limit = _earliest(until, None if idle is None else time.monotonic() + idle)
                try:
                    event = stream.next(limit)
                except TimeoutError:
                    within = idle if limit != until else deadline
                    raise late(self.endpoint, within or self.timeout) from None
                except http2.ConnectionLost as exc:
                    event = ("lost", str(exc), None)
                yield from (reply.FromString(m) for m in answer.feed(event))
        finally:
            stream.cancel()
        if answer.code != "OK":
            raise self._failure(str(answer.code), answer.details, answer.metadata, deadline)

    def _connected(self, deadline: float | None) -> http2.Http2Connection:
        """The open connection; a lost one is opened again (``UnreachableError`` if that
        cannot be done: the daemon went between two calls)."""
        connection = self._connection
        if connection is not None and connection.usable:
            return connection
        reason = connection.lost if connection is not None else None
        if connection is not None:
            connection.close()
            self._connection = None
        if not self.open():
            raise unreachable(self.endpoint, reason or "Socket closed")
        assert self._connection is not None
        return self._connection

    def _headers(self, path: str, deadline: float | None) -> list[tuple[str, str]]:
        headers = [
            *self._fixed, (":path", path), ("te", "trailers"),
            ("content-type", "application/grpc"), ("user-agent", USER_AGENT),
        ]  # fmt: skip
        if deadline is not None:
            headers.append(("grpc-timeout", _timeout(deadline)))
        return headers

    def _failure(
        self, code: str, details: str, metadata: Sequence[object], deadline: float | None
    ) -> DynamoError:
        """``call_error``'s rule; a status came back, so the daemon was reached."""
        within = self.timeout if deadline is None else deadline
        return call_error(self.endpoint, code, details, metadata, within=within, connected=True)


class _Answer:
    """A call's answer as its stream's events come: messages, then the status."""

    def __init__(self) -> None:
        self.code: str | None = None
        self.details = ""
        self.metadata: list[tuple[str, str | bytes]] = []
        self.headed = False
        self.encoding: str | None = None
        self.buffer = bytearray()

    def feed(self, event: http2.Event) -> list[bytes]:
        """The whole messages ``event`` completes; sets ``code`` once the call is over."""
        kind, value, extra = event
        if kind == "data":
            self.buffer += value
            return self._messages()
        if kind == "headers":
            self._headers(value, bool(extra))
        elif kind == "end":
            self._status("INTERNAL", "the daemon ended the call without a status")
        elif kind == "reset":
            self._status(RESET_CODES.get(value, "INTERNAL"),
                         f"Received RST_STREAM with error code {value}")  # fmt: skip
        elif kind == "lost":
            self._status("UNAVAILABLE", value)
        return []

    def _headers(self, headers: list[tuple[str, str]], end: bool) -> None:
        first, self.headed = not self.headed, True
        fields: dict[str, str] = {}
        for name, value in headers:
            fields.setdefault(name, value)
            if not name.startswith((":", "grpc-")) and name not in ("content-type", "te"):
                self.metadata.append((name, _unbased(value) if name.endswith("-bin") else value))
        status = fields.get(":status", "")
        if first and status != "200":
            known = HTTP_CODES.get(int(status), "UNKNOWN") if status.isdigit() else "UNKNOWN"
            self._status(known, f"Received http2 header with status: {status}")
            return
        if first:
            self.encoding = fields.get("grpc-encoding")
        if not end and "grpc-status" not in fields:
            return
        number = fields.get("grpc-status", "")
        if not number.isdigit() or int(number) >= len(CODES):
            self._status("UNKNOWN", f"the daemon's status {number!r} is not gRPC's")
            return
        self._status(CODES[int(number)], _unpercent(fields.get("grpc-message", "")))

    def _status(self, code: str, details: str) -> None:
        if self.code is None:
            self.code, self.details = code, details

    def _messages(self) -> list[bytes]:
        found: list[bytes] = []
        while len(self.buffer) >= 5:
            compressed, size = struct.unpack_from(">BI", self.buffer)
            if size > MAX_ANSWER:
                larger = f"Received message larger than max ({size} vs. {MAX_ANSWER})"
                self._status("RESOURCE_EXHAUSTED", larger)
                return found
            if len(self.buffer) < 5 + size:
                break
            message = bytes(self.buffer[5 : 5 + size])
            del self.buffer[: 5 + size]
            if compressed:
                message = self._decompressed(message)
            found.append(message)
        return found

    def _decompressed(self, message: bytes) -> bytes:
        import zlib

        if self.encoding == "gzip":
            return zlib.decompress(message, wbits=31)
        if self.encoding == "deflate":
            return zlib.decompress(message)
        raise _failed(f"a message compressed with {self.encoding!r}, which this client reads not")


def _failed(message: str) -> DynamoError:
    from dynamod.errors import RemoteError

    return RemoteError(f"INTERNAL: {message}")


def _address(target: str) -> str | tuple[str, int] | None:
    """A unix socket's path, or TCP's host and port; None for another kind of target."""
    if target.startswith("unix:"):
        path = target[len("unix:") :]
        if path.startswith("//"):
            path = path[2:]
            if not path.startswith("/"):  # an authority: not ours to read
                return None
        return path or None
    host, colon, port = target.rpartition(":")
    if not colon or not port.isdigit() or not host or "/" in host:
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host or "[" in host:
        return None
    return host, int(port)


def _proxied() -> bool:
    return any(os.environ.get(name) or os.environ.get(name.upper()) for name in PROXIES)


def _tls(credentials: Credentials) -> ssl.SSLContext | Literal[False] | None:
    """The TLS context ``credentials`` ask for (None: plain; False: left to gRPC, which
    trusts its own roots where no CA is given)."""
    if not (credentials.tls or credentials.ca or credentials.cert):
        return None
    if credentials.ca is None:
        return False
    if credentials.cert is not None and not hasattr(os, "memfd_create"):
        return False
    import ssl

    try:
        context = ssl.create_default_context(cadata=credentials.ca.decode("ascii"))
        if credentials.cert is not None and credentials.key is not None:
            _load_pair(context, credentials.cert, credentials.key)
    except (ssl.SSLError, UnicodeDecodeError, ValueError, OSError):
        return False  # gRPC says what is wrong with them
    context.set_alpn_protocols(["h2"])
    return context


def _load_pair(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """The client certificate and its key, from memory (``load_cert_chain`` reads only
    files: these are files in memory, gone when closed)."""
    files = []
    try:
        for name, content in (("cert", cert), ("key", key)):
            fd = os.memfd_create(f"dynamoctl-{name}", os.MFD_CLOEXEC)
            files.append(fd)
            os.write(fd, content)
        context.load_cert_chain(f"/proc/self/fd/{files[0]}", f"/proc/self/fd/{files[1]}")
    finally:
        for fd in files:
            os.close(fd)


def _discard(sock: socket.socket | None) -> None:
    if sock is not None:
        sock.close()


def _timeout(seconds: float) -> str:
    """``grpc-timeout``: at most 8 digits and a unit."""
    millis = max(1, round(seconds * 1000))
    return f"{millis}m" if millis < 100_000_000 else f"{min(round(seconds), 99_999_999)}S"


def _earliest(*times: float | None) -> float | None:
    known = [t for t in times if t is not None]
    return min(known) if known else None


def _unbased(value: str) -> bytes:
    return base64.b64decode(value + "=" * (-len(value) % 4))


def _unpercent(text: str) -> str:
    """``grpc-message``: UTF-8, percent-encoded."""
    if "%" not in text:
        return text
    raw, out, at = text.encode(), bytearray(), 0
    while at < len(raw):
        if raw[at] == 0x25 and _hex(raw[at + 1 : at + 3]):
            out.append(int(raw[at + 1 : at + 3], 16))
            at += 3
        else:
            out.append(raw[at])
            at += 1
    return out.decode("utf-8", "replace")


def _hex(pair: bytes) -> bool:
    return len(pair) == 2 and all(c in b"0123456789abcdefABCDEF" for c in pair)
