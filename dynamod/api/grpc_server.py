"""The gRPC server: listeners (unix socket 0660, TCP with TLS / mTLS), the services,
``grpc.health.v1`` and reflection. ``bind`` takes the listeners (and fails at once when one
is busy); ``start`` serves on them once the daemon has its first snapshot.

Health is NOT_SERVING until the daemon says it is ready (first snapshot applied), and
NOT_SERVING again from the start of a drain.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from dynamod.api.error_status import fit, status_of, trailers
from dynamod.api.service import ServiceContext, add_services
from dynamod.api.v1 import dynamo_pb2 as pb
from dynamod.control import MAX_EXPLAIN_PROMPT
from dynamod.errors import ConfigError, DynamoError, ListenError
from dynamod.settings import DaemonSettings, parse_hostport
from dynamod.settings.checks import check_socket_path

log = logging.getLogger(__name__)

SOCKET_MODE = 0o660
MAX_REQUEST = 4 * MAX_EXPLAIN_PROMPT + 1024 * 1024
"""The largest request the API takes: an explain prompt of the most characters allowed,
each of up to 4 bytes of UTF-8, and a MiB for the rest (a taint update of 4096 taints of
1 KiB fits too). A larger one is refused by gRPC itself (``RESOURCE_EXHAUSTED``) before
the daemon reads it."""
MAX_ANSWER = 64 * 1024 * 1024
"""The largest answer: a listing or a ``RESYNC`` of 10,000 workers is about 7 MB."""


class _ClientGone(logging.Filter):
    """grpc logs an ERROR with a traceback when a streaming client disappears while the
    server writes to it (a killed ``dynamoctl events tail``). That is a normal end of a
    stream, not a server fault: keep it as one debug line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("ExecuteBatchError raised in core by servicer method"):
            log.debug("a streaming client went away: %s", record.getMessage())
            return False
        return True


logging.getLogger("grpc._cython.cygrpc").addFilter(_ClientGone())


class _ReflectionNeedsCredentials(aio.ServerInterceptor):
    """Server reflection lists every method: on TCP it asks for the same credentials as
    the API (a token or a client certificate); on the unix socket file permissions decide,
    as for everything else. Health stays open: probes carry no credentials."""

    def __init__(self) -> None:
        self.api: ServiceContext | None = None

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: Any
    ) -> Any:
        handler = await continuation(details)
        if handler is None or not details.method.startswith("/grpc.reflection."):
            return handler
        answer = handler.stream_stream

        async def guarded(requests: Any, context: Any) -> AsyncIterator[Any]:
            assert self.api is not None, "start() sets the API before serving"
            try:
                self.api.identify(context)
            except DynamoError as exc:
                context.set_trailing_metadata(trailers(exc))
                await context.abort(status_of(exc), fit(str(exc)))
            async for reply in answer(requests, context):
                yield reply

        return grpc.stream_stream_rpc_method_handler(
            guarded,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


@dataclass
class GrpcServer:
    server: aio.Server
    health: health.aio.HealthServicer
    services: list[str]
    reflection_guard: _ReflectionNeedsCredentials
    addresses: list[str] = field(default_factory=list)
    sockets: list[Path] = field(default_factory=list)

    async def serving(self, ok: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if ok
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *self.services):
            await self.health.set(name, status)

    async def stop(self, grace: float | None) -> None:
        await self.server.stop(grace)
        for path in self.sockets:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


async def bind(settings: DaemonSettings) -> GrpcServer:
    """The gRPC server with every listener bound, serving nothing yet: a busy socket or
    port fails here (``ListenError``), before the daemon has changed anything, and leaves
    no socket file behind."""
    guard = _ReflectionNeedsCredentials()
    server = aio.server(
        interceptors=[guard],
        options=[
            ("grpc.max_receive_message_length", MAX_REQUEST),
            ("grpc.max_send_message_length", MAX_ANSWER),
            ("grpc.so_reuseport", 0),
        ],
    )
    result = GrpcServer(server, health.aio.HealthServicer(), [], guard)
    try:
        for address in settings.listen:
            _bind(result, address, settings)
    except BaseException:
        await result.stop(None)
        raise
    for path in result.sockets:
        os.chmod(path, SOCKET_MODE)
    return result


async def start(grpc: GrpcServer, api: ServiceContext) -> None:
    """Add the services (ours, health NOT_SERVING until ``serving(True)``, reflection) and
    start serving on the listeners ``bind`` took."""
    server = grpc.server
    grpc.reflection_guard.api = api
    grpc.services = add_services(server, api)
    if api.metrics is not None:
        api.metrics.known_operations(_methods(grpc.services))
    health_pb2_grpc.add_HealthServicer_to_server(grpc.health, server)
    reflection.enable_server_reflection(
        [*grpc.services, health.SERVICE_NAME, reflection.SERVICE_NAME], server
    )
    await grpc.serving(False)
    await server.start()


def _methods(services: list[str]) -> list[str]:
    """The methods of the services named in full (``dynamo.v1.WorkerService``)."""
    return [
        method.name
        for service in pb.DESCRIPTOR.services_by_name.values()
        if service.full_name in services
        for method in service.methods
    ]


def _bind(result: GrpcServer, address: str, settings: DaemonSettings) -> None:
    if address.startswith("unix://"):
        path = Path(address[len("unix://") :])
        _prepare_socket(path)
        try:
            result.server.add_insecure_port(f"unix:{path}")
        except RuntimeError:  # grpc: "Failed to bind to address"
            raise ListenError(f"cannot listen on {address}: grpc could not bind it") from None
        result.sockets.append(path)
        result.addresses.append(f"unix://{path}")
        return
    host, port = parse_hostport(address, "listen")
    credentials = _tls(settings)
    target = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    try:
        bound = (
            result.server.add_secure_port(target, credentials)
            if credentials is not None
            else result.server.add_insecure_port(target)
        )
    except RuntimeError:  # grpc: "Failed to bind to address"
        bound = 0
    if bound == 0:
        raise ListenError(f"cannot listen on {address}: the address is in use or not this host's")
    result.addresses.append(f"{host}:{bound}")


def _prepare_socket(path: Path) -> None:
    """Make way for the socket at ``path`` as ``settings.checks.check_socket_path`` allows: its
    directory made, a stale socket removed; never another kind of file."""
    stale = check_socket_path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    if stale:
        path.unlink(missing_ok=True)  # a socket from a process that is gone


def _tls(settings: DaemonSettings) -> grpc.ServerCredentials | None:
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    try:
        pair = (settings.tls_key.read_bytes(), settings.tls_cert.read_bytes())
        ca = settings.tls_client_ca.read_bytes() if settings.tls_client_ca else None
    except OSError as exc:
        raise ConfigError(f"TLS files cannot be read: {exc}") from None
    return grpc.ssl_server_credentials(
        [pair], root_certificates=ca, require_client_auth=ca is not None
    )
