"""The KV cache events a worker relays from its engine: the ``kv`` lines of the engine
events stream (``dynamod.engine_events``), each a ``KvBatch`` of ``KvEvent``s. Apart from the
engine's load, so that a listing, which reads loads, never builds these classes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dynamod.errors import InvalidInputError


@dataclass(frozen=True)
class BlockStored:
    """The engine cached full blocks: ``hashes`` are its names for them in chain order,
    ``parent`` its name for the block before the first (None: they start the prompt), and
    ``token_ids`` their tokens, ``block_size`` per block."""

    hashes: tuple[int, ...]
    parent: int | None
    token_ids: tuple[int, ...]
    block_size: int

    def __post_init__(self) -> None:
        if not self.hashes or self.block_size < 1:
            raise InvalidInputError(
                f"a stored event needs blocks and a block size >= 1, got {len(self.hashes)} "
                f"blocks of size {self.block_size}"
            )
        if len(self.token_ids) != self.block_size * len(self.hashes):
            raise InvalidInputError(
                f"a stored event of {len(self.hashes)} blocks of {self.block_size} tokens "
                f"carries {len(self.token_ids)} tokens"
            )


@dataclass(frozen=True)
class BlockRemoved:
    """The engine evicted the blocks it names ``hashes``."""

    hashes: tuple[int, ...]


@dataclass(frozen=True)
class AllBlocksCleared:
    """The engine dropped its whole prefix cache."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class KvBatch:
    """KV events in the order the engine published them; ``ts``: the wall clock
    (``time.time()``) when it did, for measuring how late a router learns them."""

    events: tuple[KvEvent, ...]
    ts: float

    def to_json(self, seq: int) -> dict[str, Any]:
        return {
            "seq": seq,
            "type": "kv",
            "ts": self.ts,
            "events": [_event_json(e) for e in self.events],
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> KvBatch:
        """A ``kv`` line's events; anything malformed is refused with the field named."""
        ts, events = obj.get("ts"), obj.get("events")
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
            raise InvalidInputError(f"a kv event line's ts must be a number, got {ts!r:.80}")
        if not isinstance(events, list):
            raise InvalidInputError(f"a kv event line's events must be a list, got {events!r:.80}")
        return cls(tuple(_event_of(e) for e in events), float(ts))


def _event_json(event: KvEvent) -> dict[str, Any]:
    if isinstance(event, BlockStored):
        return {
            "kind": "stored",
            "hashes": list(event.hashes),
            "parent": event.parent,
            "tokens": list(event.token_ids),
            "block_size": event.block_size,
        }
    if isinstance(event, BlockRemoved):
        return {"kind": "removed", "hashes": list(event.hashes)}
    return {"kind": "cleared"}


def _event_of(obj: object) -> KvEvent:
    if not isinstance(obj, Mapping):
        raise InvalidInputError(f"a kv event must be a JSON object, got {obj!r:.80}")
    kind = obj.get("kind")
    if kind == "stored":
        parent = None if obj.get("parent") is None else _int(obj, "parent")
        tokens, size = _ints(obj, "tokens"), _int(obj, "block_size")
        return BlockStored(_ints(obj, "hashes"), parent, tokens, size)
    if kind == "removed":
        return BlockRemoved(_ints(obj, "hashes"))
    if kind == "cleared":
        return AllBlocksCleared()
    raise InvalidInputError(f"unknown kv event kind {kind!r:.80}; known: stored, removed, cleared")


def _int(obj: Mapping[str, Any], name: str) -> int:
    value = obj.get(name)
    if type(value) is not int or value < 0:
        raise InvalidInputError(
            f"kv event field {name!r} must be an integer >= 0, got {value!r:.80}"
        )
    return value


def _ints(obj: Mapping[str, Any], name: str) -> tuple[int, ...]:
    items = obj.get(name)
    if not isinstance(items, list) or not all(type(i) is int and i >= 0 for i in items):
        raise InvalidInputError(
            f"kv event field {name!r} must be a list of integers >= 0, got {items!r:.80}"
        )
    return tuple(items)
