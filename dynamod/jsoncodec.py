"""The one JSON codec: what every part of dynamod reads and writes as JSON.

* ``read(raw, what)``: JSON from outside — a client's body, a worker's record, event line,
  answer or tokenizer bundle, an upstream's answer. Parsed by orjson (``bench.codec``: 26x
  faster to encode and 2x to decode a 100k-id body than the standard library), nested at
  most ``MAX_DEPTH`` deep, NaN and Infinity refused (they are not JSON); what orjson
  refuses (an integer past 64 bits, which is JSON; its own nesting limit, which it reports
  as a memory error) is decided by the standard library's parser, on that path only.
  Every refusal is an ``InvalidInputError`` naming ``what``.
* ``write(value)``: compact UTF-8 JSON for bodies, events and wire fields; NaN refused;
  an integer past 64 bits written by the standard library.
* ``canonical(value)``: sorted keys, no spaces, ASCII: equal values give equal bytes. What
  checksums and stored records are made of (a tokenizer bundle's ``sha256``, a worker
  record, a pool policy): its bytes never change between versions.

Bounds on size are the callers' (a body's, a line's: ``http/bounded.py``).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from dynamod.errors import InvalidInputError

Json = dict[str, Any]
"""A JSON object, as read and written here."""

MAX_DEPTH = 64
"""Arrays and objects nested deeper than this are refused; an OpenAI body needs 5."""
_NESTING = (dict, list)


def read(raw: bytes | str, what: str = "the request body") -> object:
    """``raw`` parsed, or ``InvalidInputError`` saying why not: not UTF-8 JSON, or nested
    deeper than ``MAX_DEPTH``. orjson stops by itself at a nesting limit of its own, so no
    nesting exhausts a recursion."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        # orjson refuses integers past 64 bits, which are JSON (a field check then names
        # the field), and reports its nesting limit as a memory error: the standard
        # library's parser decides instead, on this path only.
        value = _strict_loads(raw, what)
    if _openings(raw) > MAX_DEPTH and _depth(value) > MAX_DEPTH:
        raise _too_deep(what)
    return value


def _openings(raw: bytes | str) -> int:
    """How many ``[`` and ``{`` ``raw`` holds, strings included: at least as many as its
    deepest nesting, since every level opens with one. Counted at C speed, so a body with
    few (an OpenAI body has a handful) skips the walk over its parsed value."""
    if isinstance(raw, str):
        return raw.count("[") + raw.count("{")
    return raw.count(b"[") + raw.count(b"{")


def _strict_loads(raw: bytes | str, what: str) -> object:
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
    return InvalidInputError(f"{what} nests arrays or objects more than {MAX_DEPTH} levels deep")


_NESTING = (dict, list)


def _depth(value: object) -> int:
    """How deeply arrays and objects nest in ``value`` (a scalar is 0), without recursion.
    A list of scalars (a prompt's token ids) is passed over at C speed, not item by item."""
    deepest, level = 0, [(value, 1)] if isinstance(value, _NESTING) else []
    while level:
        item, depth = level.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return deepest
        children = item.values() if isinstance(item, dict) else item
        if set(map(type, children)).isdisjoint(_NESTING):
            continue
        level.extend((child, depth + 1) for child in children if isinstance(child, _NESTING))
    return deepest


def read_unchecked(raw: bytes | str) -> object:
    """``raw`` parsed by orjson alone, without the depth check; ``NOT_READ`` where orjson
    refuses it. Only for a value the caller then compares with one ``read`` took (the
    worker view's fast path, ``records.split_taints``): anything else from outside goes
    through ``read``."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return NOT_READ


NOT_READ = object()
"""What ``read_unchecked`` returns for what orjson cannot read."""


def strict(value: object) -> bytes | None:
    """``value`` as JSON bytes that are equal only for strictly equal values (sorted keys;
    ``1``, ``1.0`` and ``true`` write differently, unlike Python's ``==``); None where
    orjson cannot write it (nesting past its limit, an integer past 64 bits)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return None


def write(value: object) -> bytes:
    """``value`` as compact JSON (UTF-8, no NaN)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        # An integer past 64 bits, which JSON allows and ``read`` takes: orjson cannot
        # write it, the standard library can.
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        return text.encode()


def canonical(value: object) -> bytes:
    """Sorted keys, no spaces, ASCII, no NaN: equal values give equal bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
