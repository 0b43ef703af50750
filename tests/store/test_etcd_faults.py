"""Which etcd gRPC errors mean "move to another member", "log in again", "retry later" or
"never": the table in ``dynamod.store.etcd.faults``, against the texts etcd and gRPC send."""

from __future__ import annotations

import grpc
import pytest

from dynamod.errors import LeaseExpiredError, StoreError, StoreUnavailableError
from dynamod.store.etcd.faults import Fault, classify, refused, unsent

Code = grpc.StatusCode


def error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


@pytest.mark.parametrize(
    ("code", "details", "fault"),
    [
        # The connection broke, or the member cannot serve: another member may.
        (Code.UNAVAILABLE, "failed to connect to all addresses; last error: ...", Fault.BROKEN),
        (Code.UNAVAILABLE, "Stream removed (Socket closed)", Fault.BROKEN),
        (Code.UNAVAILABLE, "etcdserver: no leader", Fault.BROKEN),
        (Code.UNAVAILABLE, "etcdserver: request timed out", Fault.BROKEN),
        (Code.DEADLINE_EXCEEDED, "Deadline Exceeded", Fault.BROKEN),
        (Code.CANCELLED, "Channel closed!", Fault.BROKEN),
        # The flake of issue 16: gRPC's words for a transport that failed mid-stream.
        (Code.INTERNAL, "Internal error from Core", Fault.BROKEN),
        (Code.INTERNAL, "Received RST_STREAM with error code 2", Fault.BROKEN),
        (Code.UNKNOWN, "Stream removed", Fault.BROKEN),
        # etcd forgot the token: log in again.
        (Code.UNAUTHENTICATED, "etcdserver: invalid auth token", Fault.TOKEN),
        (Code.INVALID_ARGUMENT, "etcdserver: revision of auth store is old", Fault.TOKEN),
        # Not now.
        (Code.RESOURCE_EXHAUSTED, "etcdserver: too many requests", Fault.BUSY),
        (Code.ABORTED, "aborted", Fault.BUSY),
        (Code.FAILED_PRECONDITION, "etcdserver: not leader", Fault.BUSY),
        # Never: retrying cannot help.
        (Code.RESOURCE_EXHAUSTED, "Sent message larger than max (5 vs. 4)", Fault.REFUSED),
        (Code.INVALID_ARGUMENT, "etcdserver: request is too large", Fault.REFUSED),
        (Code.PERMISSION_DENIED, "etcdserver: permission denied", Fault.REFUSED),
        (
            Code.INVALID_ARGUMENT,
            "etcdserver: authentication failed, invalid user ID or password",
            Fault.REFUSED,
        ),
        (Code.NOT_FOUND, "etcdserver: requested lease not found", Fault.REFUSED),
        (Code.UNKNOWN, "some unexpected server error", Fault.REFUSED),
    ],
)
def test_each_error_has_one_meaning(code: grpc.StatusCode, details: str, fault: Fault) -> None:
    assert classify(error(code, details)) is fault


def test_only_a_connection_never_made_counts_as_unsent() -> None:
    assert unsent(error(Code.UNAVAILABLE, "failed to connect to all addresses; last error: x"))
    assert not unsent(error(Code.UNAVAILABLE, "Stream removed (Socket closed)"))
    assert not unsent(error(Code.DEADLINE_EXCEEDED, "Deadline Exceeded"))


def test_a_refusal_is_permanent_and_says_what_to_fix() -> None:
    denied = refused("etcd://h/p", "put 'k'", error(Code.PERMISSION_DENIED, "permission denied"))
    assert type(denied) is StoreError and not isinstance(denied, StoreUnavailableError)
    assert "needs a role with readwrite permission" in str(denied)
    gone = refused("etcd://h/p", "refresh", error(Code.NOT_FOUND, "requested lease not found"))
    assert isinstance(gone, LeaseExpiredError)
