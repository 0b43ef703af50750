"""Hostile gRPC callers: ambiguous credentials, and server reflection over TCP.

A dynamod with a TCP listener (tokens required) and its unix socket, on a memory store.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from dynamod.api.v1 import dynamo_pb2 as pb
from dynamod.api.v1 import dynamo_pb2_grpc as rpc
from tests.support.processes import daemon_argv, started
from tests.support.servers import free_port

TOKENS = """
[[token]]
name = "ops"
secret = "ops-secret-1"
role = "write"
"""


@dataclass(frozen=True)
class Daemon:
    tcp: str
    unix: str


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    where = tmp_path_factory.mktemp("grpc")
    (where / "tokens.toml").write_text(TOKENS)
    port = free_port()
    socket = where / "d.sock"
    argv = daemon_argv(
        "memory://", socket,
        "--listen", f"127.0.0.1:{port}", "--tokens-file", str(where / "tokens.toml"),
    )  # fmt: skip
    daemon = started(argv, r"^dynamod ready:", where / "d.err")
    try:
        yield Daemon(f"127.0.0.1:{port}", f"unix://{socket}")
    finally:
        daemon.finish()


def list_services(target: str, metadata: tuple[tuple[str, str], ...]) -> list[str]:
    with grpc.insecure_channel(target) as channel:
        stub: Any = reflection_pb2_grpc.ServerReflectionStub(channel)  # untyped upstream
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (reply,) = stub.ServerReflectionInfo(iter([request]), metadata=metadata, timeout=10)
        return [s.name for s in reply.list_services_response.service]


def test_two_authorization_headers_are_refused(daemon: Daemon) -> None:
    metadata = (("authorization", "Bearer nope-nope-1"), ("authorization", "Bearer ops-secret-1"))
    with grpc.insecure_channel(daemon.tcp) as channel:
        stub = rpc.WorkerServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ListWorkers(pb.ListWorkersRequest(), metadata=metadata, timeout=10)
    error: grpc.Call = caught.value  # type: ignore[assignment]
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error.details() == "2 authorization headers were sent; send exactly one bearer token"


def test_reflection_over_tcp_needs_a_token(daemon: Daemon) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        list_services(daemon.tcp, ())
    error: grpc.Call = caught.value  # type: ignore[assignment]
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "dynamo.v1.TaintService" in list_services(
        daemon.tcp, (("authorization", "Bearer ops-secret-1"),)
    )


def test_reflection_on_the_unix_socket_is_open(daemon: Daemon) -> None:
    assert "dynamo.v1.WorkerService" in list_services(daemon.unix, ())


def test_health_stays_open_on_tcp(daemon: Daemon) -> None:
    with grpc.insecure_channel(daemon.tcp) as channel:
        stub: Any = health_pb2_grpc.HealthStub(channel)  # untyped upstream
        reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
