"""The daemon's prompt processes (``dynamod/prompts/processes.py``), real child
processes: they give the answers the event loop would, refuse what it would refuse, and
survive a job that overruns its time and a queue that is full."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from dynamod.errors import PromptWorkerError
from dynamod.http.openai import CHAT, COMPLETIONS, FieldError, json_object
from dynamod.prompts.body import CardLimits, read_head, read_prompt, tokenize_text
from dynamod.prompts.processes import PromptProcesses
from dynamod.prompts.reader import PromptReader
from dynamod.tokenizers import SimpleTokenizer

TOKENIZER = SimpleTokenizer()
MODEL = CardLimits(block_size=4, context_length=8192, checked=True)
CHAT_BODY = orjson.dumps(
    {
        "model": "m",
        "messages": [{"role": "user", "content": "hello there, prompt processes"}],
        "max_tokens": 5,
        "nvext": {"routing_constraints": {"required_taints": ["pool=a"]}, "max_wait": 2},
    }
)


async def test_a_process_answers_what_the_loop_answers() -> None:
    async with PromptProcesses(1) as workers:
        head = await workers.read_head(CHAT_BODY)
        routable = await workers.read_prompt(CHAT_BODY, CHAT, TOKENIZER, MODEL)
        tokenized = await workers.tokenize_text("some words to count", TOKENIZER, 4)
    body = json_object(CHAT_BODY)
    assert head == read_head(body)
    assert head.max_wait == 2.0
    assert routable == read_prompt(body, CHAT_BODY, CHAT, TOKENIZER, MODEL)
    assert routable.prompt_tokens > 0
    assert tokenized == tokenize_text("some words to count", TOKENIZER, 4)


async def test_a_refusal_in_a_process_is_the_loops_refusal() -> None:
    raw = orjson.dumps({"model": "m", "prompt": "hi", "temperature": 9})
    with pytest.raises(FieldError) as on_loop:
        read_prompt(json_object(raw), raw, COMPLETIONS, TOKENIZER, MODEL)
    async with PromptProcesses(1) as workers:
        with pytest.raises(FieldError) as in_process:
            await workers.read_prompt(raw, COMPLETIONS, TOKENIZER, MODEL)
        with pytest.raises(FieldError, match="nvext must be a JSON object"):
            await workers.read_head(orjson.dumps({"model": "m", "nvext": 3}))
    assert (in_process.value.param, str(in_process.value)) == ("temperature", str(on_loop.value))
    assert in_process.value.status == 400


async def test_an_overrun_job_fails_and_the_next_gets_a_fresh_process() -> None:
    huge = orjson.dumps({"model": "m", "prompt": "word " * 2_000_000})
    async with PromptProcesses(1, job_timeout=0.05) as workers:
        with pytest.raises(PromptWorkerError, match=r"longer than 0.05 s"):
            await workers.read_prompt(huge, COMPLETIONS, TOKENIZER, MODEL)
        # The overrun process was killed; a small job must start and use a new one. Its
        # own start may overrun 0.05 s on a loaded machine, so it gets a roomier pool.
    async with PromptProcesses(1, job_timeout=60) as workers:
        assert (await workers.read_head(CHAT_BODY)).model == "m"


async def test_a_full_queue_refuses_at_once() -> None:
    async with PromptProcesses(1, max_waiting=1) as workers:
        # Both are queued before the owner task runs: the second finds the queue full.
        first = asyncio.ensure_future(workers.read_head(CHAT_BODY))
        second = asyncio.ensure_future(workers.read_head(CHAT_BODY))
        with pytest.raises(PromptWorkerError, match=r"1 requests \(\d+ bytes\) are already"):
            await second
        assert (await first).model == "m"


async def test_the_reader_keeps_small_bodies_on_the_loop() -> None:
    async with PromptProcesses(1) as workers:
        reader = PromptReader(workers, offload_above=len(CHAT_BODY))
        small = await reader.read_head(CHAT_BODY)
        large = await PromptReader(workers, offload_above=len(CHAT_BODY) - 1).read_head(CHAT_BODY)
        assert small.body is not None  # parsed here
        assert large.body is None  # parsed in the process
        assert small.head == large.head
        assert await reader.read_prompt(small, CHAT, TOKENIZER, MODEL) == await reader.read_prompt(
            large, CHAT, TOKENIZER, MODEL
        )


async def test_waiting_jobs_are_bounded_by_bytes_as_well_as_by_count() -> None:
    async with PromptProcesses(1, max_waiting_bytes=len(CHAT_BODY) + 1) as workers:
        # One job always fits an empty queue; the second would pass the byte bound.
        first = asyncio.ensure_future(workers.read_head(CHAT_BODY))
        second = asyncio.ensure_future(workers.read_head(CHAT_BODY))
        with pytest.raises(PromptWorkerError, match=rf"\({len(CHAT_BODY)} bytes\) are already"):
            await second
        assert (await first).model == "m"
