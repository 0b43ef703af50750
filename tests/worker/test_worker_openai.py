"""The worker's OpenAI-compatible routes, served by aiohttp on loopback with the mocker
engine, and driven by the official ``openai`` client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from dynamod.http.openai import WORKER_ID_HEADER
from dynamod.tokenizers import SimpleTokenizer
from dynamod.worker.engines.mocker import MockerConfig, MockerEngine
from dynamod.worker.inference import InferenceRoutes

MODEL = "mock-llm"
WORKER_ID = "a1b2c3d4"
PROMPT = " ".join(["the quiet river runs north under the old stone bridge"] * 6)

FAST = MockerConfig(model_name=MODEL, block_size=16, speedup_ratio=100.0, default_output_tokens=6)
# 5 ms per decode step: a 100-token stream stays in flight for about half a second.
SLOW = MockerConfig(model_name=MODEL, block_size=16, speedup_ratio=1.0)


@dataclass
class Worker:
    url: str
    engine: MockerEngine
    routes: InferenceRoutes
    registry: CollectorRegistry
    client: openai.AsyncOpenAI

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


@asynccontextmanager
async def serve(config: MockerConfig) -> AsyncIterator[Worker]:
    """A worker app with the mocker on a free loopback port, and a client for it."""
    registry = CollectorRegistry()
    async with MockerEngine(config) as engine:
        routes = InferenceRoutes(engine, WORKER_ID, registry=registry)
        app = web.Application()
        routes.add_to(app)
        runner = web.AppRunner(app)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            host, port = runner.addresses[0][:2]
            url = f"http://{host}:{port}"
            # No retries: a 503 must reach the test, not be retried away.
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
            async with client:
                yield Worker(url, engine, routes, registry, client)
        finally:
            await runner.cleanup()


@pytest.fixture
async def worker() -> AsyncIterator[Worker]:
    async with serve(FAST) as w:
        yield w


async def test_a_completion_has_text_usage_and_the_worker_id_header(worker: Worker) -> None:
    raw = await worker.client.completions.with_raw_response.create(
        model=MODEL, prompt="the quiet river", max_tokens=5
    )
    assert raw.headers[WORKER_ID_HEADER] == WORKER_ID
    completion = raw.parse()
    choice = completion.choices[0]
    assert choice.finish_reason == "length" and len(choice.text.split()) == 5
    assert completion.model == MODEL and completion.object == "text_completion"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (3, 5)
    assert worker.metric("dynamo_worker_requests_total", route="completions", status="200") == 1
    assert worker.metric("dynamo_worker_completion_tokens_total") == 5


async def test_a_chat_completion_without_max_tokens_stops_on_its_own(worker: Worker) -> None:
    raw = await worker.client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
    )
    assert raw.headers[WORKER_ID_HEADER] == WORKER_ID
    chat = raw.parse()
    message = chat.choices[0].message
    assert message.role == "assistant" and len((message.content or "").split()) == 6
    assert chat.choices[0].finish_reason == "stop"
    assert chat.usage is not None and chat.usage.completion_tokens == 6


async def test_a_streamed_completion_matches_the_whole_one_and_ends_with_usage(
    worker: Worker,
) -> None:
    whole = await worker.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, seed=3)
    stream = await worker.client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=8,
        seed=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].text for c in chunks[:-1]) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 8
    assert all(c.usage is None for c in chunks[:-1])


async def test_a_streamed_chat_announces_the_role_then_streams_content(worker: Worker) -> None:
    stream = await worker.client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": [{"type": "text", "text": "hello there"}]}],
        max_completion_tokens=4,
        stream=True,
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].object == "chat.completion.chunk"
    content = [c.choices[0].delta.content for c in chunks[1:]]
    assert len(content) == 4 and all(content)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert len({c.id for c in chunks}) == 1


async def test_a_repeated_prompt_reports_cached_tokens(worker: Worker) -> None:
    prompt_tokens = len(SimpleTokenizer().encode(PROMPT))
    usages = []
    for _ in range(2):
        completion = await worker.client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=2
        )
        assert completion.usage is not None and completion.usage.prompt_tokens_details is not None
        usages.append(completion.usage)
    assert [u.prompt_tokens for u in usages] == [prompt_tokens, prompt_tokens]
    assert (
        usages[0].prompt_tokens_details is not None and usages[1].prompt_tokens_details is not None
    )
    assert usages[0].prompt_tokens_details.cached_tokens == 0
    assert usages[1].prompt_tokens_details.cached_tokens == (prompt_tokens - 1) // 16 * 16 > 0
    assert worker.metric("dynamo_worker_cached_tokens_total") == (prompt_tokens - 1) // 16 * 16


async def test_models_lists_the_one_served_model(worker: Worker) -> None:
    models = [m async for m in worker.client.models.list()]
    assert [m.id for m in models] == [MODEL]


async def test_unknown_keys_such_as_nvext_are_ignored(worker: Worker) -> None:
    completion = await worker.client.completions.create(
        model=MODEL,
        prompt="hello",
        max_tokens=1,
        extra_body={"nvext": {"routing_constraints": {"required_taints": ["pool=batch"]}}},
    )
    assert completion.choices[0].finish_reason == "length"


BAD_COMPLETIONS: list[tuple[dict[str, Any], str]] = [
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens must be at least 1, got 0"),
    ({"prompt": "hi", "max_tokens": True}, "max_tokens must be a positive integer, got True"),
    ({"prompt": {"text": "hi"}}, "prompt must be a string or a list of token ids"),
    ({"prompt": "hi", "n": 2}, "n must be 1"),
    ({"prompt": "hi", "temperature": 3}, "temperature must be between 0 and 2, got 3"),
    ({"prompt": "hi", "stream_options": {"include_usage": True}}, "only allowed when stream"),
    ({"prompt": "", "max_tokens": 2}, "the prompt is empty"),
    ({"prompt": "hi", "max_tokens": 9000}, "exceeds the model's context length of 8192"),
    ({"prompt": [1, 2, 10**9]}, "prompt token id 1000000000 is outside the vocabulary"),
    ({"prompt": [1.5] * 1000}, r"got \[1\.5, 1\.5, [0-9., ]*\.\.\.$"),  # echoed, cut short
]


@pytest.mark.parametrize(("body", "message"), BAD_COMPLETIONS)
async def test_a_bad_completion_body_is_a_400_naming_the_problem(
    worker: Worker, body: dict[str, Any], message: str
) -> None:
    with pytest.raises(openai.BadRequestError, match=message) as caught:
        await worker.client.completions.create(model=MODEL, **body)
    assert caught.value.response.headers[WORKER_ID_HEADER] == WORKER_ID


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "messages must be a non-empty list"),
        ([{"role": "wizard", "content": "hi"}], r"messages\[0\].role must be one of"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "list of text parts"),
    ],
)
async def test_a_bad_chat_body_is_a_400_naming_the_problem(
    worker: Worker, messages: list[Any], message: str
) -> None:
    with pytest.raises(openai.BadRequestError, match=message):
        await worker.client.chat.completions.create(model=MODEL, messages=messages)


async def test_another_models_name_is_a_404(worker: Worker) -> None:
    with pytest.raises(openai.NotFoundError, match="this worker serves 'mock-llm'") as caught:
        await worker.client.completions.create(model="other", prompt="hi")
    assert caught.value.response.headers[WORKER_ID_HEADER] == WORKER_ID


async def test_every_response_carries_the_worker_id_even_invalid_json_and_wrong_methods(
    worker: Worker,
) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{worker.url}/v1/completions", data=b"{not json") as bad:
            assert bad.status == 400
            assert "not valid JSON" in (await bad.json())["error"]["message"]
            assert bad.headers[WORKER_ID_HEADER] == WORKER_ID
        async with http.get(f"{worker.url}/v1/completions") as wrong_method:
            assert wrong_method.status == 405
            assert wrong_method.headers[WORKER_ID_HEADER] == WORKER_ID


async def test_draining_refuses_new_requests_while_the_in_flight_stream_finishes() -> None:
    async with serve(SLOW) as worker:
        stream = await worker.client.completions.create(
            model=MODEL, prompt="hello", max_tokens=100, stream=True
        )
        chunks = aiter(stream)
        await anext(chunks)
        worker.routes.begin_drain()

        with pytest.raises(openai.InternalServerError, match="draining") as caught:
            await worker.client.completions.create(model=MODEL, prompt="hi")
        assert caught.value.status_code == 503
        assert caught.value.response.headers[WORKER_ID_HEADER] == WORKER_ID

        idle = asyncio.create_task(worker.routes.wait_idle())
        await anext(chunks)
        assert not idle.done() and worker.routes.in_flight == 1
        rest = [chunk async for chunk in chunks]
        async with asyncio.timeout(10):
            await idle
        assert len(rest) == 98 and rest[-1].choices[0].finish_reason == "length"
        assert worker.metric("dynamo_worker_requests_total", route="completions", status="503") == 1


async def test_a_client_disconnect_mid_stream_frees_the_engine_slot() -> None:
    async with serve(SLOW) as worker:
        stream = await worker.client.completions.create(
            model=MODEL, prompt="hello", max_tokens=2000, stream=True
        )
        await anext(aiter(stream))
        assert worker.engine.stats().active_requests == 1
        await stream.close()

        async with asyncio.timeout(10):  # the whole stream would take ten simulated seconds
            await worker.routes.wait_idle()
        stats = worker.engine.stats()
        assert (stats.active_requests, stats.waiting_requests, stats.kv_blocks_used) == (0, 0, 0)
        assert worker.metric("dynamo_worker_completion_tokens_total") == 0, "it never finished"


async def test_an_engine_stopping_mid_stream_ends_the_stream_with_an_error_event() -> None:
    async with serve(SLOW) as worker:
        stream = await worker.client.completions.create(
            model=MODEL, prompt="hello", max_tokens=2000, stream=True
        )
        chunks = aiter(stream)
        await anext(chunks)
        await worker.engine.__aexit__(None, None, None)  # as the runtime's forced stop would

        with pytest.raises(openai.APIError, match="the mocker engine stopped"):
            async for _ in chunks:
                pass
        with pytest.raises(openai.InternalServerError, match="not running") as caught:
            await worker.client.completions.create(model=MODEL, prompt="hi")
        assert caught.value.status_code == 503
