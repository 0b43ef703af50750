"""The bounds every HTTP surface puts on what a client sends: time (``HttpLimits``), body
size (``MAX_BODY``) and JSON nesting (``jsoncodec.MAX_DEPTH``); and on what a worker or an upstream
server answers (``AnswerLimits``). Their defaults are documented in the README ("Limits
and threat model")."""

from __future__ import annotations

from dataclasses import dataclass

from dynamod.errors import InvalidInputError

MAX_BODY = 8 * 1024 * 1024
"""The largest request body the worker's inference routes and the daemon's front accept
(``fits_body``). One number for both: the front refuses, before routing, what a worker
would refuse, and never forwards a body larger than it took."""


def fits_body(size: int) -> bool:
    """Whether a body of ``size`` bytes is within ``MAX_BODY``: the one comparison. It is
    aiohttp's own for an application's ``client_max_size`` (``size > limit`` is refused),
    which the front and the worker's inference routes are given as ``MAX_BODY``."""
    return size <= MAX_BODY


@dataclass(frozen=True)
class HttpLimits:
    """Time bounds on every HTTP server (``http/server.py``): a request's head must arrive
    within ``head_timeout`` of its first byte, its body within ``body_timeout``, and an
    idle keep-alive connection is closed after ``idle_timeout`` (all seconds)."""

    head_timeout: float = 10.0
    body_timeout: float = 30.0
    idle_timeout: float = 75.0

    def __post_init__(self) -> None:
        for name in ("head_timeout", "body_timeout", "idle_timeout"):
            value = getattr(self, name)
            if not 0 < value < 86_400:
                raise InvalidInputError(
                    f"{name} must be a number of seconds above 0 and below a day, got {value!r}"
                )


MIB = 1024 * 1024


@dataclass(frozen=True)
class AnswerLimits:
    """The bounds on an answer read from a worker or an upstream server (the daemon's
    front, the ``--engine openai`` worker): a whole answer of at most ``whole`` bytes, a
    stream of server-sent events of any length but no event over ``event`` bytes. An
    answer over them is cut off there, and its sender is reported. What all answers hold
    together is bounded by the daemon's memory budget (``memory.MemoryBudget``)."""

    whole: int = 64 * MIB
    event: int = 16 * MIB

    def __post_init__(self) -> None:
        for name in ("whole", "event"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 2**40:
                raise InvalidInputError(
                    f"{name} must be a number of bytes above 0 and at most 1 TiB, got {value!r}"
                )

    @classmethod
    def of_mib(cls, whole: float, event: float) -> AnswerLimits:
        """Limits given in MiB (as settings and flags give them)."""
        return cls(round(whole * MIB), round(event * MIB))
