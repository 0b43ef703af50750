"""What a worker reports about its engine, and the stream it reports it on.

A worker whose record offers engine events (``engine_events`` in the record, written by
the worker runtime; records keep fields they do not know, so older daemons ignore it)
serves ``GET /engine/events`` on its system port: newline-delimited JSON, one event per
line, each ``{"seq": n, "type": ..., ...}``, for as long as the client stays:

* ``{"type": "snapshot", "state": STATE}``: first, on every (re)connect;
* ``{"type": "state", "state": STATE}``: the engine's state changed (a whole state each
  time, so a reader may drop any but the last);
* ``{"type": "heartbeat"}``: nothing changed for ``HEARTBEAT`` seconds; a reader that
  hears nothing for a few of these treats the stream as dead;
* ``{"type": "kv", "seq": n, "ts": t, "events": [EVENT, ...]}``: the engine's KV cache
  changed (only from a worker whose record offers ``"kv"``). ``EVENT`` is
  ``{"kind": "stored", "hashes": [...], "parent": h | null, "tokens": [...],
  "block_size": b}``, ``{"kind": "removed", "hashes": [...]}`` or ``{"kind": "cleared"}``
  (``dynamod.kv_events.KvEvent``); ``ts`` is the worker's wall clock when the engine
  published them.

For ``snapshot`` / ``state`` / ``heartbeat``, ``seq`` counts the worker's state changes
since it started: it only grows within one worker incarnation (a reader may see it skip:
changes are coalesced). ``STATE`` is ``EngineLoad.to_json()``. For ``kv``, ``seq``
numbers the KV lines of this connection from 0 with no gap: the first ones are the
worker's whole cache as it knows it (a ``cleared`` event, then what is stored), so every
(re)connect rebuilds a reader's view from nothing, and a reader that fell too far behind
is sent a fresh snapshot (again ``cleared`` first) rather than a gap. A reader skips
types it does not know.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dynamod.errors import InvalidInputError
from dynamod.records import WorkerRecord

EVENTS_PATH = "/engine/events"
RECORD_FIELD = "engine_events"
KINDS = ("load", "kv")
"""What a worker's stream may carry: its engine's load (always), its KV cache events (when
the engine publishes them)."""
HEARTBEAT = 2.0
"""Seconds of silence after which a worker sends a heartbeat."""
MAX_LINE = 1 << 16
"""The longest line (newline included) a reader of the stream accepts: a longer one breaks
the protocol (the daemon drops that connection and marks the worker). A worker cuts every
KV batch well under it (``worker/engines/kvevents.py``)."""
MAX_REASON = 512
"""Characters of an ``EngineLoad.reason`` kept; a longer one is cut (it is shown in listings)."""
MAX_SOURCE = 64
"""Characters an ``EngineLoad.source`` may have."""
REACH = "reach"
"""The ``source`` of an ``EngineLoad`` that dynamod itself makes for an NVIDIA Dynamo worker,
which reports no load: ``healthy`` false while its port refuses connection
(``boundary/dynamo_reach.py``); its state is then ``unreachable``."""
_INT32 = (1 << 31) - 1
_INT64 = (1 << 63) - 1
_COUNTS = {"running": _INT32, "waiting": _INT32, "kv_blocks_used": _INT64,
           "kv_blocks_total": _INT64, "prefix_cache_hits": _INT64,
           "prefix_cache_queries": _INT64}  # fmt: skip
"""Each count's largest value: what the API's ``EngineLoad`` message can carry."""


@dataclass(frozen=True)
class EngineLoad:
    """An engine's own account of its load, as its worker reports it.

    ``running`` / ``waiting``: requests the engine is running / has queued;
    ``kv_usage``: the fraction of its KV cache in use (0..1), with ``kv_blocks_used`` of
    ``kv_blocks_total`` when known; ``prefix_cache_hits`` / ``prefix_cache_queries``:
    tokens (vLLM) or blocks (mocker) found in / looked up in the prefix cache since start;
    ``healthy`` false with ``reason`` when the engine cannot serve (an upstream server
    that stopped answering); ``source`` says where the figures come from: ``engine`` (in
    process), ``metrics`` (an upstream's Prometheus metrics), ``proxy`` (the worker's
    own count of the requests it forwards, for an upstream without metrics) or ``reach``
    (``REACH``: no figures, dynamod's own check that a Dynamo worker's port answers).
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

    def __post_init__(self) -> None:
        """Refuse what no engine can mean and the API could not carry (a negative or huge
        count, a non-finite usage, text that is not UTF-8); clamp ``kv_usage`` into 0..1
        and cut ``reason`` to ``MAX_REASON`` characters. Raises ``InvalidInputError``."""
        for name, highest in _COUNTS.items():
            value = getattr(self, name)
            if not 0 <= value <= highest:
                raise InvalidInputError(
                    f"engine state field {name!r} must be from 0 to {highest}, got {value!r}"
                )
        if not math.isfinite(self.kv_usage):
            raise InvalidInputError(
                f"engine state field 'kv_usage' must be a finite number, got {self.kv_usage!r}"
            )
        object.__setattr__(self, "kv_usage", min(max(self.kv_usage, 0.0), 1.0))
        object.__setattr__(self, "reason", _text("reason", self.reason)[:MAX_REASON])
        if len(_text("source", self.source)) > MAX_SOURCE:
            raise InvalidInputError(
                f"engine state field 'source' must be at most {MAX_SOURCE} characters, "
                f"got {len(self.source)}"
            )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: object) -> EngineLoad:
        """Read a state; a field of the wrong type is refused, an unknown one ignored."""
        if not isinstance(obj, Mapping):
            raise InvalidInputError(f"an engine state must be a JSON object, got {obj!r:.80}")
        defaults = cls()
        values: dict[str, Any] = {}
        for name, default in asdict(defaults).items():
            value = obj.get(name, default)
            values[name] = _typed(name, value, type(default))
        return cls(**values)


LoadReport = Callable[[str, EngineLoad | None], None]
"""Where a worker's engine load goes as it is read: ``report(key, load)``, ``None`` when the
worker reports none any more (its stream broke, it was marked or left out)."""


def _typed(name: str, given: object, kind: type) -> object:
    value = given
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value) if abs(value) < 1 << 53 else math.inf
    if type(value) is not kind or (isinstance(value, float) and not math.isfinite(value)):
        raise InvalidInputError(
            f"engine state field {name!r} must be a finite {kind.__name__}, got {given!r:.80}"
            if kind is float
            else f"engine state field {name!r} must be {kind.__name__}, got {given!r:.80}"
        )
    return value


def _text(name: str, value: str) -> str:
    try:
        value.encode()
    except UnicodeEncodeError:
        raise InvalidInputError(
            f"engine state field {name!r} is not valid UTF-8: {value!r:.80}"
        ) from None
    return value


def offer(*, kv: bool = False) -> dict[str, Any]:
    """The record field a worker writes to offer its events stream (with KV cache events
    when ``kv``: the worker's engine publishes them)."""
    return {"path": EVENTS_PATH, "kinds": list(KINDS if kv else KINDS[:1])}


def offers_kv(record: WorkerRecord) -> bool:
    """Whether the worker's stream carries its engine's KV cache events."""
    kinds = record.extra.get(RECORD_FIELD, {}).get("kinds") if offered_path(record) else None
    return "kv" in kinds if isinstance(kinds, list) else False


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
