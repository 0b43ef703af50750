"""The bounds every HTTP surface puts on what a client sends: time (``HttpLimits``), body
size (``MAX_BODY``) and JSON nesting (``load_json``); and on what a worker or an upstream
server answers (``AnswerLimits``). Their defaults are documented in the README ("Limits
and threat model")."""

from __future__ import annotations

import json
from dataclasses import dataclass

import orjson

from dynamod.errors import InvalidInputError

MAX_BODY = 8 * 1024 * 1024
"""The largest request body the worker's inference routes and the daemon's front accept
(``fits_body``). One number for both: the front refuses, before routing, what a worker
would refuse, and never forwards a body larger than it took."""
MAX_JSON_DEPTH = 64
"""Arrays and objects nested deeper than this are refused; an OpenAI body needs 5."""


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
    answer over them is cut off there, and its sender is reported."""

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


def load_json(raw: bytes, what: str = "the request body") -> object:
    """``raw`` parsed, or ``InvalidInputError`` saying why not: not UTF-8 JSON, or nested
    deeper than ``MAX_JSON_DEPTH``. orjson parses (``http/openai.py`` says why); it stops
    by itself at a nesting limit of its own, so no nesting exhausts a recursion."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        # orjson refuses integers past 64 bits, which are JSON (a field check then names
        # the field), and reports its nesting limit as a memory error: the standard
        # library's parser decides instead, on this path only.
        value = _strict_loads(raw, what)
    if _depth(value) > MAX_JSON_DEPTH:
        raise _too_deep(what)
    return value


def _strict_loads(raw: bytes, what: str) -> object:
    """``raw`` parsed by the standard library, which refuses NaN and Infinity here as
    orjson does (they are not JSON)."""
    try:
        return json.loads(raw, parse_constant=_not_json)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise InvalidInputError(f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise _too_deep(what) from None


def _not_json(name: str) -> object:
    raise ValueError(f"{name} is not a JSON value")


def _too_deep(what: str) -> InvalidInputError:
    return InvalidInputError(
        f"{what} nests arrays or objects more than {MAX_JSON_DEPTH} levels deep"
    )


_NESTING = (dict, list)


def _depth(value: object) -> int:
    """How deeply arrays and objects nest in ``value`` (a scalar is 0), without recursion.
    A list of scalars (a prompt's token ids) is passed over at C speed, not item by item."""
    deepest, level = 0, [(value, 1)] if isinstance(value, _NESTING) else []
    while level:
        item, depth = level.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        children = item.values() if isinstance(item, dict) else item
        if set(map(type, children)).isdisjoint(_NESTING):
            continue
        level.extend((child, depth + 1) for child in children if isinstance(child, _NESTING))
    return deepest
