"""The mocker engine: its KV cache, scheduler limits, simulated timing and determinism.

Timings are the simulated seconds the engine reports in ``Chunk.timing``, never a clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import pytest

from dynamod.errors import ConfigError, InvalidInputError, ShuttingDownError
from dynamod.tokenizers import ChatMessage, SimpleTokenizer
from dynamod.tokenizers.simple import VOCABULARY
from dynamod.worker.engines.base import Chunk, GenerateRequest
from dynamod.worker.engines.kvcache import KvCache, cache_keys
from dynamod.worker.engines.mocker import MockerConfig, MockerEngine


def config(**overrides: Any) -> MockerConfig:
    """A small, fast mocker: 16-token blocks, 1000x speed-up."""
    base: dict[str, Any] = {
        "block_size": 16,
        "num_kv_blocks": 256,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 512,
        "context_length": 512,
        "speedup_ratio": 1000.0,
    }
    return MockerConfig(**(base | overrides))


def request(prompt: range | list[int], max_tokens: int | None = 4, **kw: Any) -> GenerateRequest:
    return GenerateRequest(request_id="r", prompt_ids=tuple(prompt), max_tokens=max_tokens, **kw)


async def collect(stream: AsyncIterator[Chunk]) -> list[Chunk]:
    return [chunk async for chunk in stream]


async def run(engine: MockerEngine, req: GenerateRequest) -> list[Chunk]:
    async with aclosing(engine.generate(req)) as stream:
        return await collect(stream)


# --- tokenizer -------------------------------------------------------------------------


def test_tokenizer_ids_are_stable_and_vocabulary_words_round_trip() -> None:
    tok = SimpleTokenizer()
    ids = tok.encode("the river, the stone!")
    assert ids == tok.encode("the river, the stone!")
    assert len(ids) == 6  # four words and two punctuation marks
    assert tok.decode(tok.encode("the quiet river")) == " the quiet river"
    assert len(set(VOCABULARY)) == len(VOCABULARY), "vocabulary words must be unique"
    unknown = tok.encode("zyzzyva")[0]
    assert len(VOCABULARY) <= unknown < tok.vocab_size


def test_chat_template_ends_with_the_assistant_turn() -> None:
    text = SimpleTokenizer().render_chat(
        [ChatMessage("system", "be brief"), ChatMessage("user", "hi")]
    )
    assert text == "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"


# --- block hashes and the KV cache -----------------------------------------------------


def test_block_hashes_chain_full_blocks_only() -> None:
    assert len(cache_keys(range(10), 4)) == 2, "the partial third block has no hash"
    assert cache_keys(range(8), 4) == cache_keys(range(12), 4)[:2], "equal prefix, equal hashes"
    same_block_other_prefix = cache_keys([9, 9, 9, 9, 4, 5, 6, 7], 4)[1]
    assert same_block_other_prefix != cache_keys(range(8), 4)[1], "a hash covers its prefix"


def committed(cache: KvCache, tokens: range | list[int], extra_blocks: int = 0) -> list[Any]:
    """Allocate, prefill and commit ``tokens``; returns the held blocks."""
    hashes = cache_keys(tokens, cache.block_size)
    allocation = cache.allocate(hashes, len(hashes) + extra_blocks)
    assert allocation is not None
    blocks, _ = allocation
    cache.commit(blocks, hashes)
    return blocks


def test_a_released_prefix_is_reused_by_the_next_request() -> None:
    cache = KvCache(8, 4)
    first = committed(cache, range(12))
    cache.release(first)
    assert cache.used == 0 and cache.cached == 3

    allocation = cache.allocate(cache_keys(range(8), 4), 3)
    assert allocation is not None
    blocks, reused = allocation
    assert reused == 2 and blocks[:2] == first[:2]
    assert (cache.hits, cache.queries) == (2, 5)


def test_shared_blocks_are_reference_counted() -> None:
    cache = KvCache(8, 4)
    a = committed(cache, range(8), extra_blocks=1)
    allocation = cache.allocate(cache_keys(range(8), 4), 3)
    assert allocation is not None
    b, reused = allocation
    assert reused == 2 and cache.used == 4, "two shared blocks, one private block each"

    cache.release(a)
    assert cache.used == 3, "the shared blocks stay in use while b holds them"
    cache.release(b)
    assert cache.used == 0 and cache.cached == 2


def test_eviction_recycles_the_least_recently_freed_cached_block_tail_first() -> None:
    cache = KvCache(4, 2)
    a_hashes, b_hashes = cache_keys([1, 2, 3, 4], 2), cache_keys([5, 6, 7, 8], 2)
    cache.release(committed(cache, [1, 2, 3, 4]))
    cache.release(committed(cache, [5, 6, 7, 8]))
    assert cache.used == 0 and cache.cached == 4

    assert cache.allocate([], 1) is not None  # must evict: nothing is empty
    assert len(cache.match(a_hashes)) == 1, "a's tail block went first"
    assert len(cache.match(b_hashes)) == 2, "b was freed later and survives"


def test_an_allocation_that_does_not_fit_changes_nothing() -> None:
    cache = KvCache(4, 2)
    held = committed(cache, [1, 2, 3, 4])
    assert cache.allocate(cache_keys([1, 2, 3, 4], 2), 5) is None
    assert cache.used == 2 and (cache.hits, cache.queries) == (0, 2)
    assert [b.refs for b in held] == [1, 1]


def test_a_prefix_computed_twice_keeps_one_cached_copy() -> None:
    cache = KvCache(8, 2)
    hashes = cache_keys([1, 2, 3, 4], 2)
    racing = [cache.allocate([], 2) for _ in range(2)]  # both miss: neither is committed yet
    assert racing[0] is not None and racing[1] is not None
    for blocks, _ in (racing[0], racing[1]):
        cache.commit(blocks, hashes)
    assert cache.cached == 2
    cache.release(racing[1][0])
    assert cache.cached == 2 and cache.used == 2, "the duplicate copy was simply freed"


def test_without_prefix_caching_nothing_is_reused() -> None:
    cache = KvCache(8, 4, prefix_caching=False)
    cache.release(committed(cache, range(8)))
    assert cache.cached == 0 and cache.match(cache_keys(range(8), 4)) == []


# --- configuration ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"block_size": 0}, "block_size must be a positive integer, got 0"),
        ({"num_kv_blocks": 1.5}, "num_kv_blocks must be a positive integer, got 1.5"),
        ({"speedup_ratio": 0}, "speedup_ratio must be greater than 0"),
        ({"speedup_ratio": float("inf")}, "speedup_ratio must be a finite number"),
        (
            {"prefill_seconds_per_token": -1},
            "prefill_seconds_per_token must be a finite number >= 0",
        ),
        ({"decode_seconds_per_seq": "fast"}, "decode_seconds_per_seq must be a number"),
        ({"model_name": ""}, "model_name must be a non-empty string, got ''"),
        ({"enable_prefix_caching": "yes"}, "enable_prefix_caching must be true or false"),
        ({"max_num_seqs": 600}, r"max_num_batched_tokens \(512\) must be at least max_num_seqs"),
        (
            {"enable_chunked_prefill": False, "context_length": 1024},
            r"at least context_length \(1024\) when chunked prefill is off",
        ),
    ],
)
def test_invalid_config_is_refused_with_the_field_and_value(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        config(**overrides)


def test_model_card_reflects_the_config() -> None:
    card = MockerEngine(config(model_name="m1")).model_card()
    assert (card.name, card.engine, card.kv_block_size, card.total_kv_blocks) == (
        "m1",
        "mocker",
        16,
        256,
    )
    assert (card.max_num_seqs, card.max_num_batched_tokens, card.context_length) == (8, 512, 512)


# --- the engine ------------------------------------------------------------------------


async def test_output_is_deterministic_for_a_seed_and_for_a_prompt() -> None:
    async with MockerEngine(config()) as engine:
        seeded = [await run(engine, request(range(p, p + 20), seed=7)) for p in (0, 100)]
        unseeded = [await run(engine, request(range(p, p + 20))) for p in (0, 0, 100)]

    def text(chunks: list[Chunk]) -> str:
        return "".join(c.text for c in chunks)

    assert text(seeded[0]) == text(seeded[1]), "the seed alone decides the output"
    assert text(unseeded[0]) == text(unseeded[1]), "the same prompt gives the same output"
    assert text(unseeded[0]) != text(unseeded[2])
    assert all(c.token_ids and c.text for c in seeded[0])


async def test_max_tokens_ends_with_length_and_its_absence_with_a_simulated_stop() -> None:
    async with MockerEngine(config(default_output_tokens=3)) as engine:
        capped = await run(engine, request(range(20), max_tokens=5))
        free = await run(engine, request(range(20), max_tokens=None))
    assert [c.finish_reason for c in capped] == [None] * 4 + ["length"]
    assert capped[-1].usage.prompt_tokens == 20 and capped[-1].usage.completion_tokens == 5
    assert len(free) == 3 and free[-1].finish_reason == "stop"


async def test_a_repeated_prompt_is_served_from_the_prefix_cache_and_prefills_faster() -> None:
    cfg = config()
    async with MockerEngine(cfg) as engine:
        first = (await run(engine, request(range(100), max_tokens=1)))[-1]
        again = (await run(engine, request(range(100), max_tokens=1)))[-1]
        stats = engine.stats()
    assert first.usage.cached_tokens == 0
    assert again.usage.cached_tokens == 96, "six full blocks within the first 99 tokens"
    assert first.timing.prefill_seconds == pytest.approx(cfg.step_seconds(100, 0))
    assert again.timing.prefill_seconds == pytest.approx(cfg.step_seconds(4, 0))
    assert (stats.prefix_cache_hits, stats.prefix_cache_queries) == (6, 12)


async def test_speedup_ratio_divides_every_simulated_duration() -> None:
    timings = []
    for ratio in (100.0, 1000.0):
        async with MockerEngine(config(speedup_ratio=ratio)) as engine:
            timings.append((await run(engine, request(range(64), max_tokens=3)))[-1].timing)
    slow, fast = timings
    assert slow.prefill_seconds == pytest.approx(10 * fast.prefill_seconds)
    assert slow.decode_seconds == pytest.approx(10 * fast.decode_seconds)
    assert fast.decode_seconds == pytest.approx(2 * config().step_seconds(0, 1))


async def test_chunked_prefill_splits_a_prompt_over_the_step_budget() -> None:
    chunked = config(max_num_batched_tokens=64)
    whole = config(max_num_batched_tokens=512, enable_chunked_prefill=False)
    async with MockerEngine(chunked) as a, MockerEngine(whole) as b:
        split = (await run(a, request(range(100), max_tokens=1)))[-1].timing.prefill_seconds
        single = (await run(b, request(range(100), max_tokens=1)))[-1].timing.prefill_seconds
    assert split == pytest.approx(chunked.step_seconds(64, 0) + chunked.step_seconds(36, 0))
    assert single == pytest.approx(whole.step_seconds(100, 0))


async def test_max_num_seqs_bounds_running_requests_and_the_rest_wait_in_order() -> None:
    log: list[str] = []
    peak = 0

    async def consume(engine: MockerEngine, name: str) -> None:
        nonlocal peak
        req = GenerateRequest(request_id=name, prompt_ids=tuple(range(10)), max_tokens=3)
        async with aclosing(engine.generate(req)) as stream:
            async for chunk in stream:
                peak = max(peak, engine.stats().active_requests)
                if chunk.usage.completion_tokens == 1:
                    log.append(f"{name} first")
        log.append(f"{name} done")

    async with MockerEngine(config(max_num_seqs=2)) as engine, asyncio.TaskGroup() as tg:
        for name in "abcd":
            tg.create_task(consume(engine, name))
    assert peak == 2
    assert log.index("c first") > min(log.index("a done"), log.index("b done"))
    assert log.index("d first") > max(log.index("a done"), log.index("b done"))


async def test_a_request_waits_while_the_kv_cache_cannot_hold_it() -> None:
    seen = []

    async def consume(engine: MockerEngine, start: int) -> None:
        async with aclosing(engine.generate(request(range(start, start + 40)))) as stream:
            seen.extend([engine.stats() async for _ in stream])

    # Each request needs 3 blocks of 16 (40 prompt + 4 output tokens); the cache has 4.
    async with MockerEngine(config(num_kv_blocks=4)) as engine, asyncio.TaskGroup() as tg:
        tg.create_task(consume(engine, 0))
        tg.create_task(consume(engine, 1000))
    assert seen[0].active_requests == 1 and seen[0].waiting_requests == 1
    assert seen[0].kv_blocks_used == 3 and seen[0].kv_blocks_total == 4
    assert len(seen) == 8 and engine.stats().kv_blocks_used == 0


@pytest.mark.parametrize(
    ("req", "message"),
    [
        (request([]), "the prompt is empty"),
        (request([SimpleTokenizer.vocab_size]), "outside the vocabulary"),
        (request(range(10), max_tokens=0), "max_tokens must be at least 1, got 0"),
        (
            request(range(500), max_tokens=20),
            r"prompt \(500 tokens\) plus max_tokens \(20\) exceeds",
        ),
        (request(range(512), max_tokens=None), "leaves no room for output"),
        (request(range(100), max_tokens=100), "needs 13 KV blocks but the cache holds only 8"),
    ],
)
async def test_requests_beyond_the_engine_limits_are_refused_when_generate_is_called(
    req: GenerateRequest, message: str
) -> None:
    async with MockerEngine(config(num_kv_blocks=8)) as engine:
        with pytest.raises(InvalidInputError, match=message):
            engine.generate(req)
        assert engine.stats().waiting_requests == 0


async def test_closing_a_stream_early_frees_its_slot_and_blocks() -> None:
    async with MockerEngine(config()) as engine:
        async with aclosing(engine.generate(request(range(40), max_tokens=400))) as stream:
            await anext(stream)
            assert engine.stats().active_requests == 1 and engine.stats().kv_blocks_used == 28
        assert engine.stats().active_requests == 0 and engine.stats().kv_blocks_used == 0


async def test_cancelling_a_consumer_frees_its_slot_for_a_waiting_request() -> None:
    first_chunk = asyncio.Event()

    async def hog(engine: MockerEngine) -> None:
        async with aclosing(engine.generate(request(range(40), max_tokens=400))) as stream:
            async for _ in stream:
                first_chunk.set()

    async with MockerEngine(config(max_num_seqs=1)) as engine:
        hogging = asyncio.create_task(hog(engine))
        await first_chunk.wait()
        waiter = asyncio.create_task(run(engine, request(range(40), max_tokens=2)))
        hogging.cancel()
        await asyncio.wait([hogging])
        stats = engine.stats()  # only the waiter is left, admitted or not yet
        assert stats.active_requests + stats.waiting_requests == 1 and stats.kv_blocks_used <= 3
        chunks = await waiter
    assert hogging.cancelled()
    assert chunks[-1].finish_reason == "length"
    assert engine.stats().kv_blocks_used == 0


async def test_exiting_the_engine_fails_open_streams_and_refuses_new_ones() -> None:
    engine = MockerEngine(config())
    async with engine:
        stream = engine.generate(request(range(40), max_tokens=400))
        await anext(stream)
    async with aclosing(stream):
        with pytest.raises(ShuttingDownError, match="stopped"):
            await collect(stream)
    with pytest.raises(ShuttingDownError, match="not running"):
        await run(engine, request(range(4)))
    assert engine.stats().kv_blocks_used == 0
