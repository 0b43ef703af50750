"""KV-aware prefix overlap: which blocks each worker's engine really holds, from the KV
cache events engines publish (``kv_events.KvEvent``; workers forward them on their engine
events stream, ``dynamod.boundary`` follows it and calls ``attach`` / ``apply`` / ``detach``).

* **Keys.** A block is indexed under the router's own chained hash of its tokens
  (``prefix.chain``): the hash the front computes for a prompt's block, so a prompt finds
  the blocks an engine holds whatever hash the engine uses. The engine's hash is kept, per
  worker, only to translate the events that name blocks by it: a removal, and a stored
  event's parent. A stored event whose parent the worker's index does not hold (it came
  before the index was attached, or the worker's limit pushed it out) cannot be chained
  and is dropped (``dropped`` counts it); a removal of an unknown block is ignored.
* **Gaps and restarts.** Every (re)connection of a worker's stream begins with the
  worker's whole cache (a ``cleared`` event, then what is stored), so the index of that
  worker is rebuilt from nothing, never patched over a gap (``saturation.py``).
* **Memory.** Per block: one entry engine hash → router hash in the worker's dict, one in
  the shared holders dict (the worker's key, or a set when several workers hold it). Each
  worker keeps at most ``limit`` blocks (``attach``: the smaller of the router's
  ``kv_blocks_per_worker`` and the engine's own KV blocks); past it the oldest stored are
  forgotten first (an engine that holds more than its cache missed removals). The index
  as a whole keeps at most ``total`` (worker, block) entries (0: no bound): a block
  stored while it is full pushes out the oldest block of the worker that holds the most
  beyond its fair share (``total`` / workers followed) — the storing worker itself when
  it already holds its share — so workers that flood it evict their own blocks, never
  those of workers within their share (``evicted`` counts them). ``python -m
  bench.prefix --memory`` measures the bytes per block.
* A worker the index does not follow has no KV overlap here: ``Overlaps`` asks the
  approximate ``PrefixIndex`` about it instead, so approximate mode stays where no
  events arrive.

Pure and synchronous; event-loop thread only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dynamod.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from dynamod.router.prefix import APPROXIMATE, ROOT, PrefixIndex, chain

KV = "kv"
"""Overlap source: the engine's own KV cache events (``KvIndex``)."""


class _Cache:
    """What one worker's engine holds: its block names → the router's, oldest first."""

    __slots__ = ("blocks", "extra", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.blocks: dict[int, int] = {}
        # An engine may cache two copies of one block (two requests computed the same
        # prefix at once) and report each; the copies beyond the first, by engine hash.
        self.extra: dict[int, int] = {}


class KvIndex:
    """The blocks each followed worker's engine holds; see the module docstring."""

    def __init__(self, total: int = 0) -> None:
        if total < 0:
            raise ValueError(f"a KV index's total bound must be >= 0 blocks, got {total}")
        self.total = total
        """(Worker, block) entries kept at most, all workers; 0: no bound."""
        self._caches: dict[str, _Cache] = {}
        self._holders: dict[int, str | set[str]] = {}
        self._size = 0
        self._victim = ""  # the worker that held the most the last time one was sought
        self.dropped = 0
        """Stored blocks not indexed: parent unknown, or pushed out by a worker's limit."""
        self.evicted = 0
        """Blocks pushed out because the index as a whole held ``total``."""

    def __len__(self) -> int:
        """Blocks indexed, all workers (a block two workers hold counts twice)."""
        return self._size

    @property
    def workers(self) -> int:
        """Workers followed."""
        return len(self._caches)

    def follows(self, worker: str) -> bool:
        """Whether ``worker``'s KV events are followed (its overlap comes from here)."""
        return worker in self._caches

    def blocks(self, worker: str) -> int:
        """Blocks indexed for ``worker``."""
        cache = self._caches.get(worker)
        return len(cache.blocks) if cache is not None else 0

    def attach(self, worker: str, limit: int) -> None:
        """Follow ``worker`` from an empty cache, keeping at most ``limit`` blocks."""
        self.detach(worker)
        self._caches[worker] = _Cache(max(limit, 1))

    def detach(self, worker: str) -> None:
        """Stop following ``worker`` and forget its blocks."""
        cache = self._caches.pop(worker, None)
        if cache is not None:
            self._size -= len(cache.blocks)
            for block in cache.blocks.values():
                self._unhold(block, worker)

    def apply(self, worker: str, events: Iterable[KvEvent]) -> None:
        """Fold ``worker``'s events in, in order. Ignored for a worker not attached."""
        cache = self._caches.get(worker)
        if cache is None:
            return
        for event in events:
            if isinstance(event, BlockStored):
                self._store(worker, cache, event)
            elif isinstance(event, BlockRemoved):
                for engine_hash in event.hashes:
                    self._remove(worker, cache, engine_hash)
            elif isinstance(event, AllBlocksCleared):
                self.attach(worker, cache.limit)
                cache = self._caches[worker]

    def overlaps(self, hashes: Sequence[int]) -> dict[str, int]:
        """Worker → number of leading blocks of ``hashes`` its engine holds (absent:
        none)."""
        found: dict[str, int] = {}
        alive: set[str] | None = None
        for depth, block in enumerate(hashes, start=1):
            held = self._holders.get(block)
            if held is None:
                break
            if isinstance(held, str):
                if alive is not None and held not in alive:
                    break
                alive = {held}
            else:
                alive = set(held) if alive is None else alive & held
                if not alive:
                    break
            found.update(dict.fromkeys(alive, depth))
        return found

    def _store(self, worker: str, cache: _Cache, event: BlockStored) -> None:
        parent = ROOT if event.parent is None else cache.blocks.get(event.parent)
        if parent is None:
            self.dropped += len(event.hashes)
            return
        ours = chain(parent, event.token_ids, event.block_size)
        for engine_hash, block in zip(event.hashes, ours, strict=True):
            if engine_hash in cache.blocks:
                cache.extra[engine_hash] = cache.extra.get(engine_hash, 0) + 1
                continue
            if len(cache.blocks) >= cache.limit:
                self._remove(worker, cache, next(iter(cache.blocks)), every=True)
                self.dropped += 1
            elif self.total and self._size >= self.total:
                self._make_room(worker, cache)
            cache.blocks[engine_hash] = block
            self._size += 1
            self._hold(block, worker)

    def _make_room(self, worker: str, cache: _Cache) -> None:
        """Forget one block for ``total``'s sake: the oldest of ``worker`` when it holds
        its share already, else the oldest of the worker holding the most."""
        share = self.total // len(self._caches)
        if not cache.blocks or len(cache.blocks) < share:
            worker, cache = self._largest(share)
        self._remove(worker, cache, next(iter(cache.blocks)), every=True)
        self.evicted += 1

    def _largest(self, share: int) -> tuple[str, _Cache]:
        """The worker holding the most; the last one found while it is still over its
        share (a search is a pass over every worker)."""
        cache = self._caches.get(self._victim)
        if cache is None or len(cache.blocks) <= share:
            self._victim = max(self._caches, key=lambda k: len(self._caches[k].blocks))
            cache = self._caches[self._victim]
        return self._victim, cache

    def _remove(self, worker: str, cache: _Cache, engine_hash: int, every: bool = False) -> None:
        copies = cache.extra.get(engine_hash, 0)
        if copies and not every:
            if copies == 1:
                del cache.extra[engine_hash]
            else:
                cache.extra[engine_hash] = copies - 1
            return
        cache.extra.pop(engine_hash, None)
        block = cache.blocks.pop(engine_hash, None)
        if block is not None:
            self._size -= 1
            self._unhold(block, worker)

    def _hold(self, block: int, worker: str) -> None:
        held = self._holders.get(block)
        if held is None:
            self._holders[block] = worker  # most blocks have one holder: no set for them
        elif isinstance(held, str):
            if held != worker:
                self._holders[block] = {held, worker}
        else:
            held.add(worker)

    def _unhold(self, block: int, worker: str) -> None:
        held = self._holders.get(block)
        if held == worker:
            del self._holders[block]
        elif isinstance(held, set):
            held.discard(worker)
            if len(held) == 1:
                self._holders[block] = next(iter(held))


class Overlaps:
    """The router's overlap source when engines may publish KV events: a worker the KV
    index follows gets its overlap from there, every other one from the approximate
    ``PrefixIndex`` (which then remembers only what was sent to those)."""

    def __init__(self, approximate: PrefixIndex, kv: KvIndex) -> None:
        self.approximate = approximate
        self.kv = kv

    def overlaps(self, hashes: Sequence[int]) -> dict[str, int]:
        found = self.kv.overlaps(hashes)
        if len(self.approximate):
            for worker, depth in self.approximate.overlaps(hashes).items():
                if not self.kv.follows(worker):
                    found[worker] = depth
        return found

    def record(self, worker: str, hashes: Iterable[int]) -> None:
        if not self.kv.follows(worker):
            self.approximate.record(worker, hashes)

    def source(self, worker: str) -> str:
        return KV if self.kv.follows(worker) else APPROXIMATE
