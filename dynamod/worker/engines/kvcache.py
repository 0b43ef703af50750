"""The mocker's simulated paged KV cache with prefix caching, and the KV events it emits.

Pure and synchronous. The cache names full prompt blocks by chained hashes of their tokens
(``cache_keys``, as vLLM names its blocks) and, like vLLM, reports what it caches and
evicts as ``reported.KvEvent``s: ``BlockStored`` when a request's prompt blocks are
committed (a run of blocks each the parent of the next is one event), ``BlockRemoved``
when eviction recycles a cached block, ``AllBlocksCleared`` when ``reset`` empties it.
They wait in ``events`` until the engine ``drain``s them (once per scheduler step, as
vLLM publishes once per engine step).
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from dynamod.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent


def cache_keys(token_ids: Sequence[int], block_size: int) -> list[int]:
    """The names the simulated cache gives the full blocks of ``token_ids`` (a partial tail
    has none): chained 64-bit hashes, as vLLM names its blocks.

    Block ``i``'s key covers its own tokens and, through its parent's key, every token
    before it: equal keys mean equal prefixes. Stable across processes (blake2b). These are
    the engine's names; a router computes its own (``router.prefix.prefix_hashes``).
    """
    hashes: list[int] = []
    parent = b""
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = token_ids[start : start + block_size]
        digest = hashlib.blake2b(parent + struct.pack(f"<{block_size}q", *block), digest_size=8)
        parent = digest.digest()
        hashes.append(int.from_bytes(parent, "big"))
    return hashes


@dataclass(eq=False)
class Block:
    """One physical KV block. ``hash`` is set while it is in the prefix cache."""

    id: int
    hash: int | None = None
    refs: int = 0


class KvCache:
    """A paged KV cache with prefix caching. Pure and synchronous.

    A block is *used* while a request holds it (``refs`` > 0). A free block either holds
    nothing, or is *cached*: it keeps its prefix hash and can be reused by a later request
    with that prefix until LRU eviction recycles it. Blocks are released tail first, so a
    prefix's last blocks are evicted before its first ones.
    """

    def __init__(
        self, num_blocks: int, block_size: int, *, prefix_caching: bool = True, events: bool = False
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.hits = 0
        self.queries = 0
        self.emits = events
        """Whether the cache records ``KvEvent``s for ``drain``."""
        self.events: list[KvEvent] = []
        self._empty: list[Block] = [Block(i) for i in reversed(range(num_blocks))]
        self._cached: dict[int, Block] = {}
        self._evictable: OrderedDict[int, Block] = OrderedDict()  # cached, unused; LRU first

    @property
    def used(self) -> int:
        return self.num_blocks - len(self._empty) - len(self._evictable)

    @property
    def cached(self) -> int:
        """Blocks holding a prefix hash, used or not."""
        return len(self._cached)

    def match(self, hashes: Sequence[int]) -> list[Block]:
        """The cached blocks of the longest cached prefix of ``hashes``."""
        found: list[Block] = []
        for h in hashes if self.prefix_caching else ():
            block = self._cached.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def allocate(self, lookup: Sequence[int], count: int) -> tuple[list[Block], int] | None:
        """Hold ``count`` blocks, reusing cached ones for the prefix ``lookup`` names.

        Returns the blocks (the reused prefix first) and how many were reused, or None,
        changing nothing, when the cache cannot supply them now.
        """
        hits = self.match(lookup)
        idle_hits = sum(1 for b in hits if b.refs == 0)
        if count - len(hits) > len(self._empty) + len(self._evictable) - idle_hits:
            return None
        self.queries += len(lookup)
        self.hits += len(hits)
        for block in hits:
            self._hold(block)
        fresh = [self._take() for _ in range(count - len(hits))]
        return hits + fresh, len(hits)

    def commit(
        self, blocks: Sequence[Block], hashes: Sequence[int], token_ids: Sequence[int] = ()
    ) -> None:
        """Publish computed prompt blocks under their hashes, for later requests to reuse.

        A hash already cached (another request computed the same prefix meanwhile) keeps
        its block; this request's copy stays private and is recycled on release.
        ``token_ids`` (the prompt) go into the ``BlockStored`` events.
        """
        if not self.prefix_caching:
            return
        fresh: list[int] = []  # positions of the blocks cached by this call
        for i, (block, h) in enumerate(zip(blocks, hashes, strict=False)):
            if block.hash is None and h not in self._cached:
                block.hash = h
                self._cached[h] = block
                fresh.append(i)
        if self.emits:
            for first, end in _runs(fresh):
                self._stored(hashes, token_ids, first, end)

    def _stored(
        self, hashes: Sequence[int], token_ids: Sequence[int], first: int, end: int
    ) -> None:
        size = self.block_size
        parent = hashes[first - 1] if first else None
        tokens = tuple(token_ids[first * size : end * size])
        self.events.append(BlockStored(tuple(hashes[first:end]), parent, tokens, size))

    def reset(self) -> bool:
        """Forget every cached block, as vLLM's ``reset_prefix_cache``: only when no
        request holds a block (else False, nothing changed)."""
        if self.used:
            return False
        for block in self._cached.values():
            block.hash = None
            self._empty.append(block)
        self._cached.clear()
        self._evictable.clear()
        if self.emits:
            self.events.append(AllBlocksCleared())
        return True

    def drain(self) -> list[KvEvent]:
        """The events recorded since the last drain, oldest first."""
        events, self.events = self.events, []
        return events

    def release(self, blocks: Sequence[Block]) -> None:
        """Drop one reference to each block; unreferenced ones become free (tail first)."""
        for block in reversed(blocks):
            block.refs -= 1
            if block.refs > 0:
                continue
            if block.hash is None:
                self._empty.append(block)
            else:
                self._evictable[block.hash] = block

    def _hold(self, block: Block) -> None:
        if block.refs == 0 and block.hash is not None:
            del self._evictable[block.hash]
        block.refs += 1

    def _take(self) -> Block:
        if self._empty:
            block = self._empty.pop()
        else:
            victim, block = self._evictable.popitem(last=False)
            del self._cached[victim]
            block.hash = None
            if self.emits:
                self.events.append(BlockRemoved((victim,)))
        block.refs = 1
        return block


def _runs(positions: Sequence[int]) -> list[tuple[int, int]]:
    """Ascending positions as ``(first, end)`` runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for i in positions:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs
