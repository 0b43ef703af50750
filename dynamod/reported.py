"""What a worker reports about its engine, and the stream it reports it on.

A worker whose record offers engine events (``engine_events`` in the record, written by
the worker runtime; records keep fields they do not know, so older daemons ignore it)
serves ``GET /engine/events`` on its system port: newline-delimited JSON, one event per
line, each ``{"seq": n, "type": ..., ...}``, for as long as the client stays:

* ``{"type": "snapshot", "state": STATE}``: first, on every (re)connect;
* ``{"type": "state", "state": STATE}``: the engine's state changed (a whole state each
  time, so a reader may drop any but the last);
* ``{"type": "heartbeat"}``: nothing changed for ``HEARTBEAT`` seconds; a reader that
  hears nothing for a few of these treats the stream as dead.

``seq`` counts the worker's state changes since it started: it only grows within one
worker incarnation (a reader may see it skip: changes are coalesced). Issue 18's KV cache
events will travel on this same stream as further types (a reader skips types it does not
know). ``STATE`` is ``EngineLoad.to_json()``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dynamod.errors import InvalidInputError
from dynamod.model import WorkerRecord

EVENTS_PATH = "/engine/events"
RECORD_FIELD = "engine_events"
KINDS = ("load",)
"""What a worker's stream carries now; issue 18 adds ``"kv"``."""
HEARTBEAT = 2.0
"""Seconds of silence after which a worker sends a heartbeat."""


@dataclass(frozen=True)
class EngineLoad:
    """An engine's own account of its load, as its worker reports it.

    ``running`` / ``waiting``: requests the engine is running / has queued;
    ``kv_usage``: the fraction of its KV cache in use (0..1), with ``kv_blocks_used`` of
    ``kv_blocks_total`` when known; ``prefix_cache_hits`` / ``prefix_cache_queries``:
    tokens (vLLM) or blocks (mocker) found in / looked up in the prefix cache since start;
    ``healthy`` false with ``reason`` when the engine cannot serve (an upstream server
    that stopped answering); ``source`` says where the figures come from: ``engine`` (in
    process), ``metrics`` (an upstream's Prometheus metrics) or ``proxy`` (the worker's
    own count of the requests it forwards, for an upstream without metrics).
    """

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_queries: int = 0
    healthy: bool = True
    reason: str = ""
    source: str = "engine"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: object) -> EngineLoad:
        """Read a state; a field of the wrong type is refused, an unknown one ignored."""
        if not isinstance(obj, Mapping):
            raise InvalidInputError(f"an engine state must be a JSON object, got {obj!r}")
        defaults = cls()
        values: dict[str, Any] = {}
        for name, default in asdict(defaults).items():
            value = obj.get(name, default)
            values[name] = _typed(name, value, type(default))
        return cls(**values)


def _typed(name: str, value: object, kind: type) -> object:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if type(value) is not kind or (kind is float and not math.isfinite(float(str(value)))):
        raise InvalidInputError(
            f"engine state field {name!r} must be {kind.__name__}, got {value!r}"
        )
    return value


def offer() -> dict[str, Any]:
    """The record field a worker writes to offer its events stream."""
    return {"path": EVENTS_PATH, "kinds": list(KINDS)}


def offered_path(record: WorkerRecord) -> str | None:
    """The path of the worker's events stream on its system address, or None when its
    record offers none (or offers nothing this daemon reads)."""
    obj = record.extra.get(RECORD_FIELD)
    if not isinstance(obj, dict) or not record.system_address:
        return None
    path, kinds = obj.get("path"), obj.get("kinds")
    if not isinstance(path, str) or not path.startswith("/") or not isinstance(kinds, list):
        return None
    return path if "load" in kinds else None
