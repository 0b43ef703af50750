"""Which gRPC status code each of our errors maps to, by name (no gRPC import here).

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
"""

from __future__ import annotations

from dynamod import errors as e

TABLE: list[tuple[type[e.DynamoError], str]] = [
    (e.InvalidInputError, "INVALID_ARGUMENT"),
    (e.NotFoundError, "NOT_FOUND"),
    (e.RevisionMismatchError, "FAILED_PRECONDITION"),
    (e.NoEligibleWorkerError, "FAILED_PRECONDITION"),
    (e.ConflictError, "ABORTED"),
    (e.StoreUnavailableError, "UNAVAILABLE"),
    (e.ShuttingDownError, "UNAVAILABLE"),
    (e.QueueFullError, "RESOURCE_EXHAUSTED"),
    (e.QueueTimeoutError, "DEADLINE_EXCEEDED"),
    (e.PermissionDeniedError, "PERMISSION_DENIED"),
    (e.UnauthenticatedError, "UNAUTHENTICATED"),
]


def code_name(error: BaseException) -> str:
    """The gRPC status code name for ``error``."""
    for cls, name in TABLE:
        if isinstance(error, cls):
            return name
    return "INTERNAL"
