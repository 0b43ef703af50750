"""The gRPC server: listeners (unix socket 0660, TCP with TLS / mTLS), the services,
``grpc.health.v1`` and reflection.

Health is NOT_SERVING until the daemon says it is ready (first snapshot applied), and
NOT_SERVING again from the start of a drain.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from dynamod.api.service import ServiceContext, add_services
from dynamod.config import Settings, parse_hostport
from dynamod.errors import ConfigError

log = logging.getLogger(__name__)

SOCKET_MODE = 0o660
MAX_MESSAGE = 64 * 1024 * 1024


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


@dataclass
class GrpcServer:
    server: aio.Server
    health: health.aio.HealthServicer
    services: list[str]
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


async def start(api: ServiceContext, settings: Settings) -> GrpcServer:
    server = aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.so_reuseport", 0),
        ]
    )
    services = add_services(server, api)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [*services, health.SERVICE_NAME, reflection.SERVICE_NAME], server
    )
    result = GrpcServer(server, health_servicer, services)
    await result.serving(False)
    for address in settings.listen:
        _bind(result, address, settings)
    await server.start()
    for path in result.sockets:
        os.chmod(path, SOCKET_MODE)
    return result


def _bind(result: GrpcServer, address: str, settings: Settings) -> None:
    if address.startswith("unix://"):
        path = Path(address[len("unix://") :])
        _prepare_socket(path)
        result.server.add_insecure_port(f"unix:{path}")
        result.sockets.append(path)
        result.addresses.append(f"unix://{path}")
        return
    host, port = parse_hostport(address, "listen")
    credentials = _tls(settings)
    target = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    bound = (
        result.server.add_secure_port(target, credentials)
        if credentials is not None
        else result.server.add_insecure_port(target)
    )
    if bound == 0:
        raise ConfigError(f"cannot listen on {address}: the address is in use or invalid")
    result.addresses.append(f"{host}:{bound}")


def _prepare_socket(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    if not path.exists():
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # a stale socket from a process that is gone
            return
    raise ConfigError(f"another process is already listening on {path}")


def _tls(settings: Settings) -> grpc.ServerCredentials | None:
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
