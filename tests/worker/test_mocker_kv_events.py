"""The mocker publishes the KV events of its simulated cache, as vLLM does: what its
events add up to is what its cache holds, and a router's index fed with them finds the
prompts the cache would hit."""

from __future__ import annotations

import random

from dynamod.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from dynamod.router.kvindex import KvIndex
from dynamod.router.prefix import prefix_hashes
from dynamod.worker.engines.kvcache import KvCache, cache_keys
from dynamod.worker.engines.mocker import MockerEngine
from tests.worker.test_mocker import config, request, run


def test_committing_a_prompt_stores_its_new_blocks_as_one_chained_event() -> None:
    cache = KvCache(8, 4, events=True)
    prompt = list(range(12))
    hashes = cache_keys(prompt, 4)
    blocks, _ = cache.allocate([], 3) or ([], 0)
    cache.commit(blocks, hashes, prompt)
    assert cache.drain() == [BlockStored(tuple(hashes), None, tuple(prompt), 4)]
    cache.release(blocks)
    longer = [*prompt, 12, 13, 14, 15]
    more, reused = cache.allocate(cache_keys(longer, 4)[:3], 4) or ([], 0)
    assert reused == 3
    cache.commit(more, cache_keys(longer, 4), longer)
    assert cache.drain() == [
        BlockStored((cache_keys(longer, 4)[3],), hashes[2], (12, 13, 14, 15), 4)
    ], "only the new block, chained to its cached parent"


def test_eviction_removes_and_a_reset_clears_only_when_idle() -> None:
    cache = KvCache(2, 2, events=True)
    first, second = [1, 2, 3, 4], [5, 6, 7, 8]
    blocks, _ = cache.allocate([], 2) or ([], 0)
    cache.commit(blocks, cache_keys(first, 2), first)
    assert not cache.reset(), "a request holds blocks"
    cache.release(blocks)
    cache.drain()
    blocks, _ = cache.allocate([], 2) or ([], 0)
    evicted = cache.drain()
    assert sorted(evicted, key=str) == sorted(
        [BlockRemoved((h,)) for h in cache_keys(first, 2)], key=str
    )
    cache.commit(blocks, cache_keys(second, 2), second)
    cache.release(blocks)
    cache.drain()
    assert cache.reset() and cache.drain() == [AllBlocksCleared()]
    assert cache.cached == 0


async def test_under_a_random_chat_load_the_events_add_up_to_the_cache() -> None:
    """Many multi-turn prompts through a cache of 24 blocks: it evicts all the time. The
    index fed the events must find, for every prompt, exactly the blocks the cache would
    reuse."""
    engine = MockerEngine(config(num_kv_blocks=24, block_size=4, max_num_seqs=2))
    rng = random.Random(7)
    index = KvIndex()
    index.attach("w", limit=1000)
    histories: list[list[int]] = [[rng.randrange(100)] for _ in range(5)]
    async with engine:
        publisher = engine.kv_events
        assert publisher is not None
        with publisher.subscribe() as subscription:
            for _ in range(40):
                history = rng.choice(histories)
                history.extend(rng.randrange(100) for _ in range(rng.randrange(2, 9)))
                del history[: max(0, len(history) - 60)]
                await run(engine, request(list(history), max_tokens=2))
                for batch in subscription.take():
                    index.apply("w", batch.events)
                cache = engine._kv  # the simulated cache is the ground truth here
                for prompt in histories:
                    held = len(cache.match(cache_keys(prompt, 4)))
                    found = index.overlaps(prefix_hashes(prompt, 4)).get("w", 0)
                    assert found == held, prompt
            assert len(publisher) == cache.cached
