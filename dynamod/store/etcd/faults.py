"""What an etcd gRPC error means for the call that got it (see "Faults" in the package
docstring): the one place that reads status codes and etcd's error texts."""

from __future__ import annotations

import enum
from typing import Final

from aetcd import rpc

from dynamod.errors import LeaseExpiredError, StoreError


class Fault(enum.Enum):
    BROKEN = "the connection to the member broke, or the member cannot serve"
    """Move to another member; the call may be retried there if that is safe."""
    TOKEN = "the auth token is no longer valid"
    """Authenticate again and retry: etcd refused the request before applying it."""
    BUSY = "etcd is overloaded or changing its leader"
    """Retryable by the caller, on the same member."""
    REFUSED = "etcd refused the request"
    """Permanent: retrying cannot help."""


Code = rpc.StatusCode

# gRPC reports a connection that broke under a call as UNAVAILABLE, DEADLINE_EXCEEDED or
# CANCELLED, and, when the transport fails in the middle of a stream, as INTERNAL ("Internal
# error from Core", RST_STREAM). etcd itself answers UNAVAILABLE for "no leader", "leader
# changed", "request timed out" and "server stopped": each means another member may serve.
_BROKEN: Final = frozenset(
    {Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED, Code.CANCELLED, Code.INTERNAL}
)
# UNKNOWN is etcd's code for an unexpected server error, but gRPC also uses it for a stream
# the transport removed: only these texts count as broken.
_TRANSPORT_TEXTS: Final = ("stream removed", "socket closed", "connection reset", "goaway")
_TOKEN_TEXTS: Final = ("invalid auth token", "revision of auth store is old")


def classify(exc: rpc.AioRpcError) -> Fault:
    code, details = exc.code(), (exc.details() or "").lower()
    if code in _BROKEN or (
        code == Code.UNKNOWN and any(text in details for text in _TRANSPORT_TEXTS)
    ):
        return Fault.BROKEN
    if code in (Code.UNAUTHENTICATED, Code.INVALID_ARGUMENT) and any(
        text in details for text in _TOKEN_TEXTS
    ):
        return Fault.TOKEN
    if code == Code.FAILED_PRECONDITION and "not leader" in details:
        return Fault.BUSY
    if code == Code.ABORTED or (code == Code.RESOURCE_EXHAUSTED and "too many" in details):
        return Fault.BUSY
    # RESOURCE_EXHAUSTED for a message over the size limit is permanent, like the rest.
    return Fault.REFUSED


def unsent(exc: rpc.AioRpcError) -> bool:
    """Whether the call failed before it left this process (no connection could be made),
    so even a request that must not run twice may be sent to another member."""
    return exc.code() == Code.UNAVAILABLE and "failed to connect" in (exc.details() or "")


def describe(exc: rpc.AioRpcError) -> str:
    return f"{exc.details()} ({exc.code().name})"


def refused(url: str, what: str, exc: rpc.AioRpcError) -> StoreError:
    """Our error for a permanent refusal."""
    details = exc.details() or ""
    if exc.code() == Code.NOT_FOUND and "lease" in details:
        return LeaseExpiredError(f"cannot {what}: the lease has expired or was revoked")
    hint = ""
    if exc.code() == Code.PERMISSION_DENIED:
        hint = "; the URL's user needs a role with readwrite permission on the key prefix"
    return StoreError(f"etcd at {url} refused to {what}: {describe(exc)}{hint}")
