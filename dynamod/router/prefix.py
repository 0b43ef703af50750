"""Prefix reuse: chained hashes of a prompt's blocks, the interface the router asks which
workers hold a prompt's leading blocks (``OverlapSource``), and its approximate-mode
implementation (``PrefixIndex``: which blocks this router recently sent to which worker)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from dynamod.errors import InvalidInputError


class OverlapSource(Protocol):
    """Which workers hold a prompt's leading KV blocks: what the router's cost credits.

    ``overlaps(hashes)`` maps a worker key to the number of *leading* blocks of ``hashes``
    (chained, ``prefix_hashes``) it holds; a worker holding none is absent. The router
    calls it once per decision and looks at every worker it returns, so it should return
    only workers that hold at least the first block. ``record(worker, hashes)`` tells the
    source that a request with those blocks was just sent to ``worker``: an approximate
    source remembers it; one fed by the workers' own KV events may ignore it. Both are
    called from the event loop's thread and must not block.
    """

    def overlaps(self, hashes: Sequence[int]) -> Mapping[str, int]: ...

    def record(self, worker: str, hashes: Iterable[int]) -> None: ...


class PrefixIndex:
    """Which prompt blocks this router recently sent to which worker (approximate mode).

    Block hashes are chained (``prefix_hashes``): equal hashes at position ``i`` mean equal
    prompts up to block ``i``, so a worker's overlap is the number of leading blocks it
    holds. Each (block, worker) pair lives ``ttl`` seconds from its last use; beyond
    ``capacity`` pairs the least recently used go first. Removed workers are not purged:
    their pairs expire like any other, and nobody asks about them.
    """

    def __init__(
        self, ttl: float, capacity: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl = ttl
        self._capacity = capacity
        self._clock = clock
        # (block, worker) → expiry; least recently used first. The TTL is the same for
        # every pair, so this is also expiry order and trimming only looks at the front.
        self._pairs: OrderedDict[tuple[int, str], float] = OrderedDict()
        self._holders: dict[int, set[str]] = {}

    def __len__(self) -> int:
        return len(self._pairs)

    def record(self, worker: str, hashes: Iterable[int]) -> None:
        """Remember that the blocks ``hashes`` were sent to ``worker``."""
        now = self._clock()
        expiry = now + self._ttl
        for block in hashes:
            pair = (block, worker)
            self._pairs[pair] = expiry
            self._pairs.move_to_end(pair)
            self._holders.setdefault(block, set()).add(worker)
        self._trim(now)

    def overlaps(self, hashes: Sequence[int]) -> dict[str, int]:
        """Worker → number of leading blocks of ``hashes`` it holds (absent: none)."""
        self._trim(self._clock())
        found: dict[str, int] = {}
        alive: set[str] | None = None
        for depth, block in enumerate(hashes, start=1):
            holders = self._holders.get(block)
            alive = set(holders or ()) if alive is None else alive & (holders or set())
            if not alive:
                break
            found.update(dict.fromkeys(alive, depth))
        return found

    def _trim(self, now: float) -> None:
        pairs = self._pairs
        while pairs:
            pair, expiry = next(iter(pairs.items()))
            if expiry > now and len(pairs) <= self._capacity:
                return
            del pairs[pair]
            holders = self._holders[pair[0]]
            holders.discard(pair[1])
            if not holders:
                del self._holders[pair[0]]


def prefix_hashes(token_ids: Sequence[int], block_size: int) -> tuple[int, ...]:
    """Chained hashes of a prompt's full blocks: hash ``i`` covers blocks ``0..i``.

    Python hashes ints and tuples of ints without per-process salt, so equal prompts give
    equal hashes in every process. The partial last block is left out: it is never cached.
    """
    if block_size < 1:
        raise InvalidInputError(f"block_size must be at least 1, got {block_size}")
    hashes = []
    parent = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, *token_ids[start : start + block_size]))
        hashes.append(parent)
    return tuple(hashes)
