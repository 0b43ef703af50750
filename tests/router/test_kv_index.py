"""The router's KV index (``router/kvindex.py``) against a brute-force model of what each
engine holds, under random stored / removed / cleared sequences; the worker's mirror
(``worker/engines/kvevents.py``) rebuilding an index that answers the same; and the
limits that bound its memory."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from dynamod.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from dynamod.router.kvindex import KvIndex, Overlaps
from dynamod.router.prefix import PrefixIndex, prefix_hashes
from dynamod.worker.engines.kvcache import cache_keys
from dynamod.worker.engines.kvevents import LINE_BYTES, KvPublisher, batched

BLOCK = 2
WORKERS = ("a", "b", "c")
# Prompts that share prefixes, as multi-turn chats do: 0 and 1 share 2 blocks, 2 and 3
# share 1, 4 stands alone.
PROMPTS = (
    (1, 2, 3, 4, 5, 6, 7, 8),
    (1, 2, 3, 4, 9, 9, 9, 9),
    (5, 5, 6, 6, 7, 7),
    (5, 5, 8, 8),
    (3, 1, 4, 1, 5, 9, 2, 6),
)


def engine_hash(tokens: tuple[int, ...]) -> int:
    """An engine's own name for the block ending ``tokens`` (not the router's hash)."""
    return cache_keys(tokens, BLOCK)[-1]


@dataclass
class Model:
    """Brute force: per worker, the token prefixes whose last block its engine holds (with
    how many copies), counting only blocks whose parent was held when they were stored
    (the index cannot chain the others)."""

    held: dict[str, Counter[tuple[int, ...]]] = field(
        default_factory=lambda: {w: Counter() for w in WORKERS}
    )

    def store(self, worker: str, prompt: tuple[int, ...], first: int, end: int) -> None:
        held = self.held[worker]
        if first and held[prompt[: first * BLOCK]] == 0:
            return  # an orphan: its parent is not held
        for block in range(first, end):
            prefix = prompt[: (block + 1) * BLOCK]
            held[prefix] += 1

    def remove(self, worker: str, name: int) -> None:
        prefix = NAMES[name]
        if self.held[worker][prefix] > 0:
            self.held[worker][prefix] -= 1

    def overlaps(self, query: tuple[int, ...]) -> dict[str, int]:
        found = {}
        for worker, held in self.held.items():
            depth = 0
            while (depth + 1) * BLOCK <= len(query) and held[query[: (depth + 1) * BLOCK]] > 0:
                depth += 1
            if depth:
                found[worker] = depth
        return found


def stored(prompt: tuple[int, ...], first: int, end: int) -> BlockStored:
    hashes = tuple(engine_hash(prompt[: (b + 1) * BLOCK]) for b in range(first, end))
    parent = engine_hash(prompt[: first * BLOCK]) if first else None
    return BlockStored(hashes, parent, prompt[first * BLOCK : end * BLOCK], BLOCK)


@st.composite
def operations(draw: st.DrawFn, *, orphans: bool = True) -> list[tuple[str, KvEvent]]:
    ops: list[tuple[str, KvEvent]] = []
    held: dict[str, set[int]] = {w: set() for w in WORKERS}  # engine names, for removals
    for _ in range(draw(st.integers(0, 40))):
        worker = draw(st.sampled_from(WORKERS))
        kind = draw(st.sampled_from(["stored", "stored", "stored", "removed", "cleared"]))
        if kind == "cleared":
            ops.append((worker, AllBlocksCleared()))
            held[worker].clear()
        elif kind == "removed" and held[worker]:
            name = draw(st.sampled_from(sorted(held[worker])))
            ops.append((worker, BlockRemoved((name,))))
        else:
            prompt = draw(st.sampled_from(PROMPTS))
            blocks = len(prompt) // BLOCK
            first = draw(st.integers(0, blocks - 1)) if orphans else 0
            if not orphans:  # engines store a block only with its parent held
                while first < blocks and engine_hash(prompt[: (first + 1) * BLOCK]) in held[worker]:
                    first += 1
                if first == blocks:
                    continue
            end = draw(st.integers(first + 1, blocks))
            event = stored(prompt, first, end)
            ops.append((worker, event))
            held[worker].update(event.hashes)
    return ops


QUERIES = [*PROMPTS, (1, 2, 3, 4), (1, 2), (5, 5, 6, 6, 9, 9), (7,), ()]


NAMES = {
    engine_hash(prompt[: (b + 1) * BLOCK]): prompt[: (b + 1) * BLOCK]
    for prompt in PROMPTS
    for b in range(len(prompt) // BLOCK)
}
"""Every block the generated events can name, by its engine hash."""


def replay(ops: list[tuple[str, KvEvent]]) -> tuple[KvIndex, Model]:
    index, model = KvIndex(), Model()
    for worker in WORKERS:
        index.attach(worker, limit=10_000)
    for worker, event in ops:
        index.apply(worker, [event])
        if isinstance(event, BlockStored):
            prompt = NAMES[event.hashes[-1]]
            first = len(prompt) // BLOCK - len(event.hashes)
            model.store(worker, prompt, first, first + len(event.hashes))
        elif isinstance(event, BlockRemoved):
            model.remove(worker, event.hashes[0])
        else:
            model.held[worker].clear()
    return index, model


@settings(max_examples=200, deadline=None)
@given(operations())
def test_the_index_answers_as_brute_force_over_what_each_engine_holds(
    ops: list[tuple[str, KvEvent]],
) -> None:
    index, model = replay(ops)
    for query in QUERIES:
        assert index.overlaps(prefix_hashes(query, BLOCK)) == model.overlaps(query), query
    assert len(index) == sum(sum(1 for n in c.values() if n) for c in model.held.values())


@settings(max_examples=100, deadline=None)
@given(operations(orphans=False))
def test_a_snapshot_of_the_mirror_rebuilds_an_index_that_answers_the_same(
    ops: list[tuple[str, KvEvent]],
) -> None:
    live, _ = replay(ops)
    mirrors = {w: KvPublisher() for w in WORKERS}
    for worker, event in ops:
        mirrors[worker].publish([event], ts=1.0)
    rebuilt = KvIndex()
    for worker, mirror in mirrors.items():
        rebuilt.attach(worker, limit=10_000)
        for batch in mirror.snapshot():
            rebuilt.apply(worker, batch.events)
    for query in QUERIES:
        hashes = prefix_hashes(query, BLOCK)
        assert rebuilt.overlaps(hashes) == live.overlaps(hashes), query
    # and it stays the same under what follows: the copies were carried over too
    for worker, event in ops:
        if isinstance(event, BlockStored):
            removal = [BlockRemoved(event.hashes)]
            live.apply(worker, removal)
            rebuilt.apply(worker, removal)
    for query in QUERIES:
        hashes = prefix_hashes(query, BLOCK)
        assert rebuilt.overlaps(hashes) == live.overlaps(hashes), query


def test_a_worker_keeps_at_most_its_limit_the_oldest_blocks_going_first() -> None:
    index = KvIndex()
    index.attach("a", limit=3)
    index.apply("a", [stored(PROMPTS[0], 0, 4)])
    assert index.blocks("a") == 3 and index.dropped == 1
    # the first block went: the prompt's overlap is gone although later blocks remain
    assert index.overlaps(prefix_hashes(PROMPTS[0], BLOCK)) == {}


def test_detaching_forgets_a_worker_and_its_blocks() -> None:
    index = KvIndex()
    index.attach("a", limit=100)
    index.attach("b", limit=100)
    for worker in ("a", "b"):
        index.apply(worker, [stored(PROMPTS[0], 0, 4)])
    index.detach("a")
    assert not index.follows("a") and index.workers == 1
    assert index.overlaps(prefix_hashes(PROMPTS[0], BLOCK)) == {"b": 4}
    index.apply("a", [stored(PROMPTS[1], 0, 4)])  # not attached: ignored
    assert len(index) == 4


def test_overlap_is_approximate_for_workers_without_events_and_kv_for_the_rest() -> None:
    kv = KvIndex()
    overlaps = Overlaps(PrefixIndex(ttl=60, capacity=100), kv)
    hashes = prefix_hashes(PROMPTS[0], BLOCK)
    kv.attach("a", limit=100)
    overlaps.record("a", hashes)  # routed there: a follows events, so nothing is assumed
    overlaps.record("b", hashes[:2])
    assert overlaps.overlaps(hashes) == {"b": 2}
    kv.apply("a", [stored(PROMPTS[0], 0, 3)])
    assert overlaps.overlaps(hashes) == {"a": 3, "b": 2}
    assert (overlaps.source("a"), overlaps.source("b")) == ("kv", "approximate")


def test_forwarded_batches_stay_under_the_line_limit_and_keep_the_chain() -> None:
    prompt = tuple(itertools.islice(itertools.cycle(range(10**6, 10**6 + 7)), 4096))
    event = stored(prompt, 0, len(prompt) // BLOCK)
    batches = list(batched([BlockRemoved((1,)), event, AllBlocksCleared()], ts=2.0))
    lines = [json.dumps(b.to_json(seq=1 << 62), separators=(",", ":")) for b in batches]
    assert all(len(line) + 1 <= LINE_BYTES for line in lines)
    pieces = [e for b in batches for e in b.events if isinstance(e, BlockStored)]
    assert len(pieces) == 3, "2,048 blocks of 7-digit tokens: some 80 KB of JSON"
    assert [p.parent for p in pieces[1:]] == [p.hashes[-1] for p in pieces[:-1]]
    index = KvIndex()
    index.attach("a", limit=100_000)
    for batch in batches:
        index.apply("a", [e for e in batch.events if not isinstance(e, AllBlocksCleared)])
    assert index.overlaps(prefix_hashes(prompt, BLOCK)) == {"a": len(prompt) // BLOCK}


def test_a_subscriber_that_falls_behind_gets_a_fresh_snapshot_not_a_gap() -> None:
    mirror = KvPublisher(backlog=4)
    with mirror.subscribe() as subscription:
        for n in range(10):
            mirror.publish([stored(PROMPTS[n % 2], 0, 4)], ts=float(n))
        batches = subscription.take()
    assert subscription.resnapshots >= 1
    assert batches[0].events[0] == AllBlocksCleared()
    index = KvIndex()
    index.attach("a", limit=100)
    for batch in batches:
        index.apply("a", batch.events)
    assert index.overlaps(prefix_hashes(PROMPTS[0], BLOCK)) == {"a": 4}
    assert index.overlaps(prefix_hashes(PROMPTS[1], BLOCK)) == {"a": 4}
