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
* every batch is cut so that its JSON line stays well under the reader's line limit
  (``MAX_TOKENS`` tokens per line; a long prompt's stored event is split along its
  chain).

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

from dynamod.engine_events import AllBlocksCleared, BlockRemoved, BlockStored, KvBatch, KvEvent

MAX_TOKENS = 4096
"""Tokens one forwarded batch carries at most (a line of ~30 KB at worst)."""
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
    """``events`` cut into batches of at most ``MAX_TOKENS`` tokens (a stored event
    longer than that split along its chain), in order."""
    out: list[KvEvent] = []
    tokens = 0
    for event in events:
        for piece in _pieces(event):
            size = len(piece.token_ids) if isinstance(piece, BlockStored) else 0
            if out and tokens + size > MAX_TOKENS:
                yield KvBatch(tuple(out), ts)
                out, tokens = [], 0
            out.append(piece)
            tokens += size
    if out:
        yield KvBatch(tuple(out), ts)


def _pieces(event: KvEvent) -> Iterator[KvEvent]:
    if not isinstance(event, BlockStored) or len(event.token_ids) <= MAX_TOKENS:
        yield event
        return
    size = event.block_size
    per = max(1, MAX_TOKENS // size)
    parent = event.parent
    for start in range(0, len(event.hashes), per):
        hashes = event.hashes[start : start + per]
        tokens = event.token_ids[start * size : (start + len(hashes)) * size]
        yield BlockStored(hashes, parent, tokens, size)
        parent = hashes[-1]
