"""The daemon's prompt worker processes (``dynamod/prompts/workers.py``), real child
processes: they give the answers the event loop would, refuse what it would refuse, and
survive a job that overruns its time and a queue that is full."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from dynamod.errors import PromptWorkerError
from dynamod.http.openai import CHAT, COMPLETIONS, FieldError, json_object
from dynamod.prompts import prepare
from dynamod.prompts.prepare import Model
from dynamod.prompts.reader import PromptReader
from dynamod.prompts.workers import PromptWorkers
from dynamod.tokenizers import SimpleTokenizer

TOKENIZER = SimpleTokenizer()
MODEL = Model(block_size=4, context_length=8192, checked=True)
CHAT_BODY = orjson.dumps(
    {
        "model": "m",
        "messages": [{"role": "user", "content": "hello there, prompt workers"}],
        "max_tokens": 5,
        "nvext": {"routing_constraints": {"required_taints": ["pool=a"]}, "max_wait": 2},
    }
)


async def test_a_process_answers_what_the_loop_answers() -> None:
    async with PromptWorkers(1) as workers:
        head = await workers.head(CHAT_BODY)
        prepared = await workers.prepare(CHAT_BODY, CHAT, TOKENIZER, MODEL)
        tokenized = await workers.tokenize("some words to count", TOKENIZER, 4)
    body = json_object(CHAT_BODY)
    assert head == prepare.head(body)
    assert head.max_wait == 2.0
    assert prepared == prepare.prepare(body, CHAT_BODY, CHAT, TOKENIZER, MODEL)
    assert prepared.prompt_tokens > 0
    assert tokenized == prepare.tokenize("some words to count", TOKENIZER, 4)


async def test_a_refusal_in_a_process_is_the_loops_refusal() -> None:
    raw = orjson.dumps({"model": "m", "prompt": "hi", "temperature": 9})
    with pytest.raises(FieldError) as on_loop:
        prepare.prepare(json_object(raw), raw, COMPLETIONS, TOKENIZER, MODEL)
    async with PromptWorkers(1) as workers:
        with pytest.raises(FieldError) as in_process:
            await workers.prepare(raw, COMPLETIONS, TOKENIZER, MODEL)
        with pytest.raises(FieldError, match="nvext must be a JSON object"):
            await workers.head(orjson.dumps({"model": "m", "nvext": 3}))
    assert (in_process.value.param, str(in_process.value)) == ("temperature", str(on_loop.value))
    assert in_process.value.status == 400


async def test_an_overrun_job_fails_and_the_next_gets_a_fresh_process() -> None:
    huge = orjson.dumps({"model": "m", "prompt": "word " * 2_000_000})
    async with PromptWorkers(1, job_timeout=0.05) as workers:
        with pytest.raises(PromptWorkerError, match=r"longer than 0.05 s"):
            await workers.prepare(huge, COMPLETIONS, TOKENIZER, MODEL)
        # The overrun process was killed; a small job must start and use a new one. Its
        # own start may overrun 0.05 s on a loaded machine, so it gets a roomier pool.
    async with PromptWorkers(1, job_timeout=60) as workers:
        assert (await workers.head(CHAT_BODY)).model == "m"


async def test_a_full_queue_refuses_at_once() -> None:
    async with PromptWorkers(1, max_waiting=1) as workers:
        # Both are queued before the owner task runs: the second finds the queue full.
        first = asyncio.ensure_future(workers.head(CHAT_BODY))
        second = asyncio.ensure_future(workers.head(CHAT_BODY))
        with pytest.raises(PromptWorkerError, match="1 large requests are already waiting"):
            await second
        assert (await first).model == "m"


async def test_the_reader_keeps_small_bodies_on_the_loop() -> None:
    async with PromptWorkers(1) as workers:
        reader = PromptReader(workers, offload_above=len(CHAT_BODY))
        small = await reader.head(CHAT_BODY)
        large = await PromptReader(workers, offload_above=len(CHAT_BODY) - 1).head(CHAT_BODY)
        assert small.body is not None  # parsed here
        assert large.body is None  # parsed in the process
        assert small.head == large.head
        assert await reader.prepare(small, CHAT, TOKENIZER, MODEL) == await reader.prepare(
            large, CHAT, TOKENIZER, MODEL
        )
