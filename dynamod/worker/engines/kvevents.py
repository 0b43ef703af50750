"""An engine's KV cache events, as the worker forwards them to every daemon.

An engine that knows what its KV cache holds publishes ``reported.KvEvent`` batches here:
the mocker from its simulated cache, ``--engine vllm`` and ``--engine openai`` from
vLLM's ZMQ publisher (``vllm_events.py``). ``KvPublisher`` keeps what they add up to (the
*mirror*: every block the engine holds, with its parent and tokens) and hands batches to
each subscriber, i.e. each daemon's events stream (``worker/publish.py``):

* a new subscriber first gets the mirror as batches (a ``cleared`` event, then the stored
  blocks, parents before children), then every batch published after it subscribed;
* a subscriber that falls ``backlog`` batches behind (a stalled daemon) has its queue
  replaced by a fresh snapshot of the mirror: memory stays bounded, and what it gets
  still adds up to the engine's cache (clear and rebuild, never a gap);
* every batch is cut so that its JSON line stays well under the readers' line limit
  (``LINE_BYTES``, half of ``engine_events.MAX_LINE``): a long prompt's stored event is
  split along its chain, a removal of many blocks into several removals, and events are
  packed into a line only while it has room. A reader applies the lines in order, so it
  ends with the same cache whatever the cut.

Why the mirror and not a replay log: the engine's whole cache is bounded (its KV blocks),
a log of everything since start is not, and a snapshot of the mirror is exactly what a
daemon that (re)connects needs. The mirror is bounded by ``capacity`` blocks too (the
engine's cache size, when known): past it the oldest are dropped, as an engine that
held more than its cache must have evicted blocks whose removal was lost.

Event-loop thread only.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections import deque
from collections.abc import Iterator, Sequence

from dynamod.engine_events import MAX_LINE
from dynamod.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvBatch, KvEvent

LINE_BYTES = MAX_LINE // 2
"""Bytes of JSON one forwarded batch's line has at most (a block too big for it alone, of
some 1,500 tokens of 20 digits, would still be under ``MAX_LINE``)."""
_LINE_OVERHEAD = 100
"""``{"seq":N,"type":"kv","ts":T,"events":[]}`` and the newline, at their longest."""
_EVENT_OVERHEAD = {BlockStored: 120, BlockRemoved: 40, AllBlocksCleared: 20}
"""An event's JSON less its lists of numbers (the parent and block size included), and
the comma after it."""
BACKLOG = 1024
"""Batches a subscriber may fall behind before it is given a fresh snapshot instead."""


class KvSubscription:
    """What one subscriber has yet to send: ``take()`` the batches, ``await wait()`` for
    more. Leave it with ``close()`` (``KvPublisher.subscribe`` is a context manager)."""

    def __init__(self, publisher: KvPublisher, backlog: int) -> None:
        self._publisher = publisher
        self._backlog = backlog
        self._pending: deque[KvBatch] = deque(publisher.snapshot())
        self._ready = asyncio.Event()
        self._ready.set()
        self.resnapshots = 0
        """How often this subscriber fell behind and was given a fresh snapshot."""

    def take(self) -> list[KvBatch]:
        batches = list(self._pending)
        self._pending.clear()
        self._ready.clear()
        return batches

    async def wait(self) -> None:
        await self._ready.wait()

    def close(self) -> None:
        self._publisher.unsubscribe(self)

    def put(self, batches: Sequence[KvBatch]) -> None:
        if len(self._pending) + len(batches) > self._backlog:
            self._pending = deque(self._publisher.snapshot())
            self.resnapshots += 1
        else:
            self._pending.extend(batches)
        self._ready.set()

    def __enter__(self) -> KvSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class KvPublisher:
    """The mirror of one engine's KV cache and its subscribers; see the module docstring."""

    def __init__(self, capacity: int = 0, *, backlog: int = BACKLOG) -> None:
        self.capacity = capacity
        """Blocks the mirror keeps at most (0: no bound known yet; the engine sets it)."""
        self._backlog = backlog
        # engine hash → (parent's engine hash, the block's tokens); oldest first. Tokens
        # as a machine array: a third of a tuple of ints' memory.
        self._mirror: dict[int, tuple[int | None, array[int]]] = {}
        # Copies beyond the first of a block stored twice (as ``router/kvindex.py``).
        self._copies: dict[int, int] = {}
        self._subscribers: set[KvSubscription] = set()
        self.published = 0
        """Batches published since start."""

    def __len__(self) -> int:
        """Blocks the engine holds, as its events say."""
        return len(self._mirror)

    def __contains__(self, engine_hash: int) -> bool:
        return engine_hash in self._mirror

    def subscribe(self) -> KvSubscription:
        subscription = KvSubscription(self, self._backlog)
        self._subscribers.add(subscription)
        return subscription

    def unsubscribe(self, subscription: KvSubscription) -> None:
        self._subscribers.discard(subscription)

    def publish(self, events: Sequence[KvEvent], ts: float | None = None) -> None:
        """Events the engine published at ``ts`` (wall clock; now when None), in order."""
        if not events:
            return
        for event in events:
            self._fold(event)
        self.published += 1
        batches = list(batched(events, time.time() if ts is None else ts))
        for subscription in self._subscribers:
            subscription.put(batches)

    def snapshot(self) -> list[KvBatch]:
        """The whole mirror as batches: a ``cleared`` event, then every block stored (a
        block the engine holds twice, twice)."""
        events: list[KvEvent] = [AllBlocksCleared(), *self._runs()]
        return list(batched(events, time.time()))

    def _fold(self, event: KvEvent) -> None:
        mirror, copies = self._mirror, self._copies
        if isinstance(event, BlockStored):
            parent, size = event.parent, event.block_size
            for i, engine_hash in enumerate(event.hashes):
                if engine_hash in mirror:
                    copies[engine_hash] = copies.get(engine_hash, 0) + 1
                else:
                    tokens = array("q", event.token_ids[i * size : (i + 1) * size])
                    mirror[engine_hash] = (parent, tokens)
                parent = engine_hash
            while self.capacity and len(mirror) > self.capacity:
                oldest = next(iter(mirror))
                del mirror[oldest]
                copies.pop(oldest, None)
        elif isinstance(event, BlockRemoved):
            for engine_hash in event.hashes:
                if copies.get(engine_hash):
                    copies[engine_hash] -= 1
                else:
                    copies.pop(engine_hash, None)
                    mirror.pop(engine_hash, None)
        else:
            mirror.clear()
            copies.clear()

    def _runs(self) -> Iterator[BlockStored]:
        """The mirror's blocks as stored events, a parent before its children; a chain of
        blocks each the parent of the next is one event."""
        done: set[int] = set()
        run: list[int] = []
        for engine_hash in self._ordered(done):
            parent = self._mirror[engine_hash][0]
            if run and parent != run[-1]:
                yield self._stored(run)
                run = []
            run.append(engine_hash)
        if run:
            yield self._stored(run)
        for engine_hash, copies in self._copies.items():
            for _ in range(copies):  # stored again: the reader counts the copy too
                yield self._stored([engine_hash])

    def _ordered(self, done: set[int]) -> Iterator[int]:
        mirror = self._mirror
        for engine_hash in mirror:
            line: list[int] = []
            block: int | None = engine_hash
            while block is not None and block in mirror and block not in done:
                line.append(block)
                done.add(block)
                block = mirror[block][0]
            yield from reversed(line)

    def _stored(self, run: list[int]) -> BlockStored:
        mirror = self._mirror
        tokens = tuple(t for h in run for t in mirror[h][1])
        return BlockStored(tuple(run), mirror[run[0]][0], tokens, len(mirror[run[0]][1]))


def batched(events: Sequence[KvEvent], ts: float) -> Iterator[KvBatch]:
    """``events`` cut into batches whose JSON lines have at most ``LINE_BYTES`` bytes (an
    event too big for one split: a stored one along its chain, a removal by its blocks),
    in order."""
    out: list[KvEvent] = []
    size = _LINE_OVERHEAD
    for event in events:
        for piece, cost in _pieces(event):
            if out and size + cost > LINE_BYTES:
                yield KvBatch(tuple(out), ts)
                out, size = [], _LINE_OVERHEAD
            out.append(piece)
            size += cost
    if out:
        yield KvBatch(tuple(out), ts)


def _pieces(event: KvEvent) -> Iterator[tuple[KvEvent, int]]:
    """``event`` as pieces that each fit a line, with a bound on their JSON sizes."""
    overhead = _EVENT_OVERHEAD[type(event)]
    room = LINE_BYTES - _LINE_OVERHEAD - overhead
    if isinstance(event, BlockRemoved):
        each = _widest(event.hashes)
        per = max(1, room // each)
        for start in range(0, len(event.hashes), per):
            hashes = event.hashes[start : start + per]
            yield BlockRemoved(hashes), overhead + each * len(hashes)
    elif isinstance(event, BlockStored):
        yield from _stored_pieces(event, overhead, room)
    else:
        yield event, overhead


def _stored_pieces(
    event: BlockStored, overhead: int, room: int
) -> Iterator[tuple[BlockStored, int]]:
    size, count = event.block_size, len(event.hashes)
    each = _widest(event.hashes) + size * _widest(event.token_ids)
    per = max(1, room // each)
    if count <= per:
        yield event, overhead + each * count
        return
    parent = event.parent
    for start in range(0, count, per):
        hashes = event.hashes[start : start + per]
        tokens = event.token_ids[start * size : (start + len(hashes)) * size]
        yield BlockStored(hashes, parent, tokens, size), overhead + each * len(hashes)
        parent = hashes[-1]


def _widest(values: Sequence[int]) -> int:
    """Bytes each of ``values`` takes at most in a JSON list: the widest one's digits and
    a comma (at least 1)."""
    if not values:
        return 1
    return max(len(str(max(values))), len(str(min(values)))) + 1
