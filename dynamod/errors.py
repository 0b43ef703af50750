"""The one error family of dynamod, dynamo-worker and dynamoctl.

Every error the product raises on purpose is a ``DynamoError``. Each also subclasses the
builtin a caller would naturally catch, so ``except ValueError`` still works::

    DynamoError                                                     status code
    ├── InvalidInputError (ValueError)          the caller sent      INVALID_ARGUMENT
    │   │                                       something we refuse
    │   ├── TaintError                          a taint is refused (grammar, reserved)
    │   ├── TaintLimitError                     too many taints, or bytes of them
    │   ├── TopologyError                       topology / kv-transfer metadata is invalid
    │   ├── ConstraintError                     routing constraints are malformed
    │   ├── ImmutableFieldError                 a same-id write changes more than taints
    │   ├── SelectorError                       a worker selector does not parse
    │   ├── InvalidKeyError                     a store key a backend cannot hold
    │   ├── ConfigError                         settings, flags or config file are invalid
    │   └── PoolPolicyError                     a pool policy is refused at apply
    ├── NotFoundError (LookupError)                                  NOT_FOUND
    │   ├── KeyNotFoundError                    store: the key does not exist
    │   ├── WorkerNotFoundError                 no worker has that id / prefix
    │   │   └── AmbiguousWorkerError            the prefix names several workers
    │   └── PolicyNotFoundError                 no pool policy has that name
    ├── RevisionMismatchError                   store CAS lost, or   FAILED_PRECONDITION
    │                                           the caller's expected revision is stale
    ├── ConflictError                           lost every CAS       ABORTED
    │                                           attempt; retryable
    ├── StoreError
    │   ├── StoreUnavailableError (ConnectionError)  down; retryable UNAVAILABLE
    │   ├── StoreClosedError                    used after aclose(): a bug, not a fault
    │   └── LeaseExpiredError                   the lease is gone; re-register
    ├── RoutingError
    │   ├── NoEligibleWorkerError               no worker satisfies  FAILED_PRECONDITION
    │   ├── QueueTimeoutError (TimeoutError)    waited too long      DEADLINE_EXCEEDED
    │   ├── QueueFullError                      the queue is full    RESOURCE_EXHAUSTED
    │   └── ShuttingDownError                   draining; retryable  UNAVAILABLE
    ├── StreamLimitError                        too many API streams RESOURCE_EXHAUSTED
    │                                           open; retryable
    ├── MemoryBudgetError                       what the daemon holds RESOURCE_EXHAUSTED
    │                                           of its peers' bytes is over its
    │                                           memory budget; retryable
    ├── AccessError (PermissionError)
    │   ├── UnauthenticatedError                no or unknown        UNAUTHENTICATED
    │   │                                       credentials
    │   └── PermissionDeniedError               credentials lack     PERMISSION_DENIED
    │                                           the right
    ├── UpstreamError                           a worker or an upstream UNAVAILABLE
    │   │                                       sent what the boundary refuses
    │   ├── OversizeError                       more bytes than its budget
    │   └── WorkerUnavailableError              a worker's route did not answer, or
    │                                           answered "not now"; retryable
    ├── UnsupportedError                        this source or worker FAILED_PRECONDITION
    │                                           cannot do that (a Dynamo fleet: writes to
    │                                           its store, the cordon, a worker without
    │                                           the taint route)
    ├── PromptWorkerError                       a large prompt could not UNAVAILABLE
    │                                           be prepared now (its workers are busy or
    │                                           one failed); retryable
    ├── NotLeaderError                          no longer the leader FAILED_PRECONDITION
    │                                           (lease lost or not refreshed in time)
    ├── RemoteError                             another process's error of a class
    │                                           this one does not know
    ├── UnreachableError (ConnectionError)      the daemon cannot be reached at all
    ├── AnswerTimeoutError (TimeoutError)       reached, but no answer within the deadline
    └── ListenError (OSError)                   a listener cannot be bound (address in use)

Each class's ``code`` is the gRPC status code name it travels as (``code_name``); a class
without one in the column above inherits its parent's, and the root's is ``INTERNAL``.
``api/error_status.py`` maps these names to gRPC's own codes; the tables of the HTTP surfaces
live beside them.

"You closed it" (``StoreClosedError``) and "it broke under you"
(``StoreUnavailableError``) are different classes on purpose: only the second is worth a
retry. Messages are whole sentences that show the offending value and, when known, the fix.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any


class DynamoError(Exception):
    """Base of every error raised on purpose by this project.

    ``fields()`` are the constructor's arguments: ``type(error)(**error.fields())`` builds
    the same error again, with the same message. That is how an error crosses the wire
    (``api/error_status.py``) and reaches a Python caller of ``dynamod.client`` whole: a class
    whose constructor takes more than a message says so by overriding ``fields``."""

    retryable: bool = False
    code: str = "INTERNAL"
    """The gRPC status code name this error travels as (see the tree above)."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)

    def fields(self) -> dict[str, object]:
        """The arguments that rebuild this error through its constructor."""
        return {"message": str(self)}

    def __reduce__(self) -> tuple[object, ...]:
        # Pickled (to and from the prompt processes) through the constructor too.
        return (_rebuilt, (type(self), self.fields()))


def _rebuilt(cls: type[DynamoError], fields: dict[str, Any]) -> DynamoError:
    return cls(**fields)


def lineage(error: DynamoError) -> str:
    """``error``'s class and its ancestors up to ``DynamoError``, by name: what a process
    that may not know the class itself needs to rebuild the nearest one it knows."""
    return " ".join(c.__name__ for c in type(error).__mro__ if issubclass(c, DynamoError))


def rebuild(names: str, fields: Mapping[str, Any], message: str) -> DynamoError:
    """The error another process raised, from its ``lineage`` and ``fields()``: the first
    class of the lineage this process knows, built through its constructor (with the
    fields it takes, and the message);
    ``RemoteError`` when it knows none of them."""
    known = _classes()
    for name in names.split():
        cls = known.get(name)
        if cls is None:
            continue
        try:
            return cls(**_arguments(cls, fields, message))
        except TypeError:  # an ancestor that needs a field the sender did not have
            continue
    return RemoteError(message)


def _arguments(cls: type[DynamoError], fields: Mapping[str, Any], message: str) -> dict[str, Any]:
    """The fields ``cls``'s constructor takes (an ancestor takes fewer than the class that
    was raised), and the message where it takes one that the fields do not give."""
    parameters = inspect.signature(cls).parameters
    arguments = {name: value for name, value in fields.items() if name in parameters}
    if "message" in parameters and "message" not in arguments:
        arguments["message"] = message
    return arguments


def _classes() -> dict[str, type[DynamoError]]:
    found: dict[str, type[DynamoError]] = {}
    pending: list[type[DynamoError]] = [DynamoError]
    while pending:
        cls = pending.pop()
        found.setdefault(cls.__name__, cls)
        pending.extend(cls.__subclasses__())
    return found


class RemoteError(DynamoError):
    """Another process reported an error of a class this one does not know."""


def code_name(error: BaseException) -> str:
    """The status code name for ``error``; ``INTERNAL`` for anything not ours."""
    return error.code if isinstance(error, DynamoError) else "INTERNAL"


class InvalidInputError(DynamoError, ValueError):
    """The input is refused; nothing was changed."""

    code = "INVALID_ARGUMENT"


def shown(value: str, limit: int = 300) -> str:
    """``repr(value)``, cut short: an error message must not carry megabytes back."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(value)} characters)"


def quoted(value: str, limit: int = 300) -> str:
    """``'value'`` as Dynamo's messages quote it, when that prints safely; else ``shown``."""
    if len(value) <= limit and value.isprintable():
        return f"'{value}'"
    return shown(value, limit)


class TaintError(InvalidInputError):
    """A taint is refused: empty, too long, padded, holding a control character, or under
    (or looking like) the reserved prefix (``dynamod.taints`` has the rules)."""

    def __init__(self, taint: str, rule: str) -> None:
        super().__init__(f"taint {quoted(taint)} {rule}")
        self.taint = taint
        self.rule = rule

    def fields(self) -> dict[str, object]:
        return {"taint": self.taint, "rule": self.rule}


class TaintLimitError(InvalidInputError):
    """An update would leave a worker more taints, or more bytes of them, than the limit
    (``dynamod.taints.TaintLimits``). Permanent: retrying the same update cannot help."""


class TopologyError(InvalidInputError):
    """Topology domains or kv-transfer settings are invalid."""


class ConstraintError(InvalidInputError):
    """Routing constraints (required / preferred taints) are malformed."""


class ImmutableFieldError(InvalidInputError):
    """A write to an existing worker record changes a field other than its taints."""

    def __init__(self, field: str, detail: str = "") -> None:
        message = f"worker record field {field!r} is immutable after registration"
        super().__init__(f"{message}; {detail}" if detail else message)
        self.field = field
        self.detail = detail

    def fields(self) -> dict[str, object]:
        return {"field": self.field, "detail": self.detail}


class SelectorError(InvalidInputError):
    """A worker selector such as ``capacity/fast,!pool=batch`` does not parse."""


class InvalidKeyError(InvalidInputError):
    """A store key holds characters the key grammar does not allow."""


class ConfigError(InvalidInputError):
    """Settings from a file, the environment or flags are invalid."""


class NotFoundError(DynamoError, LookupError):
    """Something named by the caller does not exist."""

    code = "NOT_FOUND"


class KeyNotFoundError(NotFoundError):
    """The store has no such key."""

    def __init__(self, key: str) -> None:
        super().__init__(f"key {key!r} does not exist")
        self.key = key

    def fields(self) -> dict[str, object]:
        return {"key": self.key}


class WorkerNotFoundError(NotFoundError):
    """No worker matches the id or id prefix."""

    def __init__(self, worker: str, message: str | None = None) -> None:
        super().__init__(message or f"no worker with id {shown(worker)}")
        self.worker = worker

    def fields(self) -> dict[str, object]:
        return {"worker": self.worker, "message": str(self)}


class AmbiguousWorkerError(WorkerNotFoundError):
    """An id prefix matches more than one worker."""

    def __init__(self, prefix: str, matches: list[str]) -> None:
        listed = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
        super().__init__(
            prefix,
            f"worker id prefix {shown(prefix)} is ambiguous: it matches {len(matches)} workers "
            f"({listed}); give more characters",
        )
        self.prefix = prefix
        self.matches = matches

    def fields(self) -> dict[str, object]:
        return {"prefix": self.prefix, "matches": self.matches}


class RevisionMismatchError(DynamoError):
    """A compare-and-swap found the key at another revision than expected."""

    code = "FAILED_PRECONDITION"

    def __init__(self, key: str, expected: int, actual: int) -> None:
        super().__init__(f"{key!r} is at revision {actual}, not the expected revision {expected}")
        self.key = key
        self.expected = expected
        self.actual = actual

    def fields(self) -> dict[str, object]:
        return {"key": self.key, "expected": self.expected, "actual": self.actual}


class ConflictError(DynamoError):
    """Every compare-and-swap attempt lost a race with another writer. Retry the call.

    ``attempts`` is how many were made, when the writer counted them."""

    code = "ABORTED"
    retryable = True

    def __init__(self, message: str, attempts: int | None = None) -> None:
        super().__init__(message)
        self.attempts = attempts

    def fields(self) -> dict[str, object]:
        return {"message": str(self), "attempts": self.attempts}


class StoreError(DynamoError):
    """The discovery store failed."""


class StoreUnavailableError(StoreError, ConnectionError):
    """The store did not answer in time or is down. Retryable."""

    code = "UNAVAILABLE"
    retryable = True


class StoreClosedError(StoreError):
    """The store was closed by its owner; this is a bug in the caller, not a fault."""


class LeaseExpiredError(StoreError):
    """The lease no longer exists (expired or revoked); its keys are gone."""


class RoutingError(DynamoError):
    """A request could not be routed."""


class NoEligibleWorkerError(RoutingError):
    """No worker of the model satisfies the request's constraints."""

    code = "FAILED_PRECONDITION"


class QueueTimeoutError(RoutingError, TimeoutError):
    """The request waited for an eligible worker until its deadline."""

    code = "DEADLINE_EXCEEDED"


class QueueFullError(RoutingError):
    """The pending queue is full; retry later."""

    code = "RESOURCE_EXHAUSTED"
    retryable = True


class ShuttingDownError(RoutingError):
    """The process is draining and takes no new work."""

    code = "UNAVAILABLE"
    retryable = True


class StreamLimitError(DynamoError):
    """The daemon, or this caller, already has as many API streams open as ``setting``
    allows (``max_streams``, ``max_streams_per_caller``: ``limit``); retry once one has
    ended."""

    code = "RESOURCE_EXHAUSTED"
    retryable = True

    def __init__(self, message: str, setting: str = "", limit: int = 0) -> None:
        super().__init__(message)
        self.setting = setting
        self.limit = limit

    def fields(self) -> dict[str, object]:
        return {"message": str(self), "setting": self.setting, "limit": self.limit}


class MemoryBudgetError(DynamoError):
    """What the daemon holds of its peers' bytes together (relayed streams, whole answers,
    tokenizer bundles being fetched, engine events buffers: ``http/memory.py``) is over
    ``limit`` bytes, and this holder held the most: it is refused. Retry later, when
    others are done."""

    code = "RESOURCE_EXHAUSTED"
    retryable = True

    def __init__(self, message: str, limit: int = 0) -> None:
        super().__init__(message)
        self.limit = limit

    def fields(self) -> dict[str, object]:
        return {"message": str(self), "limit": self.limit}


class AccessError(DynamoError, PermissionError):
    """The caller may not do this."""


class UnauthenticatedError(AccessError):
    """No credentials, or credentials nobody issued."""

    code = "UNAUTHENTICATED"


class PermissionDeniedError(AccessError):
    """Valid credentials without the needed right."""

    code = "PERMISSION_DENIED"


class UpstreamError(DynamoError):
    """A worker or an upstream server sent what the daemon's boundary refuses: more bytes
    than the read's budget, bytes that break the protocol, events faster than allowed.
    What it costs is that peer's connection, never the process reading it."""

    code = "UNAVAILABLE"


class OversizeError(UpstreamError):
    """``what`` was longer than ``limit`` bytes; reading stopped there."""

    def __init__(self, what: str, limit: int) -> None:
        super().__init__(f"{what} is over its limit of {limit} bytes; the rest was not read")
        self.what = what
        self.limit = limit

    def fields(self) -> dict[str, object]:
        return {"what": self.what, "limit": self.limit}


class WorkerUnavailableError(UpstreamError):
    """A worker's own route did not answer in time, or answered that it cannot act now
    (starting or stopping), or its change did not show in the store in time. Retryable:
    nothing is known to have changed, and the same update may be sent again."""

    retryable = True

    def __init__(self, worker: str, message: str) -> None:
        super().__init__(message)
        self.worker = worker

    def fields(self) -> dict[str, object]:
        return {"worker": self.worker, "message": str(self)}


class UnsupportedError(DynamoError):
    """What was asked does not carry over to this source or worker: a write to the store
    of an NVIDIA Dynamo fleet (dynamod only reads it), the operator's cordon there, a taint
    update of a Dynamo worker that registers no taint route. Permanent: the message says
    why and what to do instead."""

    code = "FAILED_PRECONDITION"


class PromptWorkerError(DynamoError):
    """The daemon's prompt processes (``dynamod/prompts``) could not take or finish a large
    prompt: too many are waiting, one took too long, or one died. Retry later."""

    code = "UNAVAILABLE"
    retryable = True


class UnreachableError(DynamoError, ConnectionError):
    """The daemon did not answer at the endpoint (not running, wrong socket, firewall)."""


class AnswerTimeoutError(DynamoError, TimeoutError):
    """The daemon was reached but did not answer within the client's deadline: the call
    may still be carried out there (an update's audit line says whether it was)."""

    code = "DEADLINE_EXCEEDED"


class ListenError(DynamoError, OSError):
    """A socket or port to serve on cannot be bound: another process holds it, or the
    address is not this machine's. Nothing was started."""


class PoolPolicyError(InvalidInputError):
    """A pool policy is refused (``dynamod.pools.policy`` has the rules); nothing was stored.
    The message names the field, the rule and the offending value."""


class NotLeaderError(DynamoError):
    """This process does not (or no longer) lead: its lease was lost, or not refreshed in
    time. Raised by ``Leadership.fence()`` right before a write only the leader may make."""

    code = "FAILED_PRECONDITION"


class PolicyNotFoundError(NotFoundError):
    """No pool policy of that name is stored."""

    def __init__(self, name: str, message: str | None = None) -> None:
        super().__init__(
            message or f"no pool policy named {shown(name)}; dynamoctl pools ls lists them"
        )
        self.name = name

    def fields(self) -> dict[str, object]:
        return {"name": self.name, "message": str(self)}
