"""Our errors ↔ gRPC status codes, for the server and the client. The table itself is the
error tree in ``dynamod/errors.py`` (each class's ``code``, by name, so the daemon's core
needs no gRPC import).

The details are the domain message. The server also sends the error's class name as
trailing metadata (``dynamo-error``), so the client re-raises the very same class; an
``UNAVAILABLE`` without it came from the transport: the daemon is unreachable.
"""

from __future__ import annotations

import grpc

from dynamod import errors as e

ERROR_KEY = "dynamo-error"


# Classes the client may rebuild from a name; each takes a single message argument there.
_BY_NAME: dict[str, type[e.DynamoError]] = {
    cls.__name__: cls
    for cls in vars(e).values()
    if isinstance(cls, type) and issubclass(cls, e.DynamoError)
}


def status_of(error: BaseException) -> grpc.StatusCode:
    return grpc.StatusCode[e.code_name(error)]


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
