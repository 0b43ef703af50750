"""Our errors ↔ gRPC status codes, for the server and the client. The table itself is the
error tree in ``dynamod/errors.py`` (each class's ``code``, by name, so the daemon's core
needs no gRPC import).

An error travels whole. The status carries the code and the message (cut to
``MAX_DETAILS``); the trailing metadata carries the class (``dynamo-error``: its name, then
its ancestors' up to ``DynamoError``) and its fields (``dynamo-error-fields-bin``: the
JSON of ``error.fields()``, the arguments of its constructor). The client rebuilds the
error through that very constructor, so ``WorkerNotFoundError.worker``,
``RevisionMismatchError.expected`` / ``.actual`` or ``ConflictError.attempts`` are there
for a Python caller as they were in the daemon. A class the client does not know becomes
its nearest known ancestor; an ``UNAVAILABLE`` with no class came from the transport: the
daemon is unreachable.

Metadata is bounded (gRPC refuses headers over 8 KiB by default), so a field's string is
cut to ``MAX_FIELD`` characters and a list to ``MAX_ITEMS`` items, as messages quote values
cut short: an error about a 20 kB taint names the taint's start, not all of it.

No gRPC import here (the server's ``status_of`` imports it when called): the light client
(``dynamod.client.light``) rebuilds errors from the status it reads off the wire itself,
by the code's name (``CODES``: gRPC's numbers, in order).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dynamod import errors as e
from dynamod import jsoncodec

if TYPE_CHECKING:
    import grpc

ERROR_KEY = "dynamo-error"
FIELDS_KEY = "dynamo-error-fields-bin"
MAX_DETAILS = 1000
MAX_FIELD = 1000
MAX_ITEMS = 64
CODES = (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED",
)  # fmt: skip
"""gRPC's status codes by number (``grpc-status``), as ``grpc.StatusCode`` names them."""


def status_of(error: BaseException) -> grpc.StatusCode:
    import grpc

    return grpc.StatusCode[e.code_name(error)]


def fit(message: str) -> str:
    """``message`` cut to what a status's details may carry."""
    if len(message) <= MAX_DETAILS:
        return message
    return message[:MAX_DETAILS] + f"... ({len(message)} characters in all)"


def trailers(error: e.DynamoError) -> tuple[tuple[str, str | bytes], ...]:
    """The trailing metadata that carries ``error``'s class and fields."""
    fields = {name: _bounded(value) for name, value in error.fields().items()}
    return ((ERROR_KEY, e.lineage(error)), (FIELDS_KEY, jsoncodec.write(fields)))


def _bounded(value: object) -> object:
    if isinstance(value, str):
        return value if len(value) <= MAX_FIELD else value[:MAX_FIELD]
    if isinstance(value, list | tuple):
        return [_bounded(v) for v in value[:MAX_ITEMS]]
    return value


def from_status(code: str, details: str, trailing: Sequence[object]) -> e.DynamoError:
    """Rebuild the daemon's error on the client side from its status (``code``: its name,
    as ``grpc.StatusCode``'s) and trailers."""
    metadata: dict[str, object] = {}
    for item in trailing:
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            metadata[item[0]] = item[1]
    lineage = metadata.get(ERROR_KEY)
    if not isinstance(lineage, str):
        if code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
            return e.UnreachableError(details)
        return e.RemoteError(f"{code}: {details}")
    return e.rebuild(lineage, _fields(metadata.get(FIELDS_KEY), details), details)


def _fields(raw: object, details: str) -> dict[str, object]:
    try:
        fields = jsoncodec.read(raw, "the error's fields") if isinstance(raw, bytes) else None
    except e.InvalidInputError:
        fields = None
    return fields if isinstance(fields, dict) else {"message": details}
