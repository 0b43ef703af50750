"""The one table between our errors and gRPC status codes, used by server and client.

| error                                   | status              |
|-----------------------------------------|---------------------|
| InvalidInputError (TaintError, ...)     | INVALID_ARGUMENT    |
| NotFoundError (WorkerNotFoundError ...) | NOT_FOUND           |
| RevisionMismatchError                   | FAILED_PRECONDITION |
| NoEligibleWorkerError                   | FAILED_PRECONDITION |
| ConflictError (lost every CAS race)     | ABORTED             |
| StoreUnavailableError                   | UNAVAILABLE         |
| ShuttingDownError                       | UNAVAILABLE         |
| QueueFullError                          | RESOURCE_EXHAUSTED  |
| QueueTimeoutError                       | DEADLINE_EXCEEDED   |
| PermissionDeniedError                   | PERMISSION_DENIED   |
| UnauthenticatedError                    | UNAUTHENTICATED     |
| anything else                           | INTERNAL            |

The details are the domain message. The server also sends the error's class name as
trailing metadata (``dynamo-error``), so the client re-raises the very same class; an
``UNAVAILABLE`` without it came from the transport: the daemon is unreachable.
"""

from __future__ import annotations

import grpc

from dynamod import errors as e

ERROR_KEY = "dynamo-error"

TABLE: list[tuple[type[e.DynamoError], grpc.StatusCode]] = [
    (e.InvalidInputError, grpc.StatusCode.INVALID_ARGUMENT),
    (e.NotFoundError, grpc.StatusCode.NOT_FOUND),
    (e.RevisionMismatchError, grpc.StatusCode.FAILED_PRECONDITION),
    (e.NoEligibleWorkerError, grpc.StatusCode.FAILED_PRECONDITION),
    (e.ConflictError, grpc.StatusCode.ABORTED),
    (e.StoreUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (e.ShuttingDownError, grpc.StatusCode.UNAVAILABLE),
    (e.QueueFullError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (e.QueueTimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (e.PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (e.UnauthenticatedError, grpc.StatusCode.UNAUTHENTICATED),
]

# Classes the client may rebuild from a name; each takes a single message argument there.
_BY_NAME: dict[str, type[e.DynamoError]] = {
    cls.__name__: cls
    for cls in vars(e).values()
    if isinstance(cls, type) and issubclass(cls, e.DynamoError)
}


def status_of(error: BaseException) -> grpc.StatusCode:
    for cls, code in TABLE:
        if isinstance(error, cls):
            return code
    return grpc.StatusCode.INTERNAL


def code_name(error: BaseException) -> str:
    name: str = status_of(error).name
    return name


class Remote(e.DynamoError):
    """Raised by the client when the daemon reports an error of a class we do not know."""


def from_status(code: grpc.StatusCode, details: str, error_name: str | None) -> e.DynamoError:
    """Rebuild the daemon's error on the client side."""
    if error_name is None and code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    ):
        return e.UnreachableError(details)
    cls = _BY_NAME.get(error_name or "")
    if cls is None:
        return Remote(f"{code.name}: {details}")
    error = cls.__new__(cls)
    Exception.__init__(error, details)
    return error
