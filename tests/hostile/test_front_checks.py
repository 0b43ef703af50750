"""The front refuses what its workers would refuse, before routing, and reads large bodies
and ``explain`` prompts off its event loop (``dynamod/prompts``), against the real
``dynamod`` and ``dynamo-worker`` processes of ``conftest.py``.

A refusal given before routing carries no ``x-dynamo-worker-id``: no worker was chosen.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from dynamod.client import AsyncClient
from dynamod.errors import InvalidInputError
from dynamod.http.openai import WORKER_ID_HEADER
from dynamod.prompts.reader import OFFLOAD_ABOVE
from tests.hostile.conftest import Fleet

MODEL = "llama"
CONTEXT = 8192  # the mocker's default context length (ModelCard.context_length)


def url(fleet: Fleet, surface: str, path: str) -> str:
    host, port = fleet.address(surface)
    return f"http://{host}:{port}{path}"


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client:
        yield client


async def post(
    session: aiohttp.ClientSession, address: str, body: dict[str, Any]
) -> tuple[int, dict[str, Any], str | None]:
    # A large body as a stream: aiohttp warns about writing megabytes of bytes at once.
    data = io.BytesIO(orjson.dumps(body))
    headers = {"Content-Type": "application/json"}
    async with session.post(address, data=data, headers=headers) as reply:
        return reply.status, await reply.json(), reply.headers.get(WORKER_ID_HEADER)


REFUSED = [
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": True}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "n": 2}, "n"),
    ("/v1/completions", {"prompt": "hi", "temperature": 2.5}, "temperature"),
    ("/v1/completions", {"prompt": "hi", "top_p": -0.1}, "top_p"),
    ("/v1/completions", {"prompt": "hi", "seed": "7"}, "seed"),
    ("/v1/completions", {"prompt": "hi", "stream": "yes"}, "stream"),
    ("/v1/completions", {"prompt": "hi", "stream_options": {}}, "stream_options"),
    ("/v1/completions", {"prompt": [], "max_tokens": 4}, "prompt"),
    ("/v1/completions", {"prompt": [1] * (CONTEXT - 2), "max_tokens": 4}, "prompt"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -1},
        "max_completion_tokens",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "stream": False, "stream_options": {}},
        "stream_options",
    ),
]


@pytest.mark.parametrize(("path", "fields", "param"), REFUSED)
async def test_front_refuses_what_the_worker_refuses_before_routing(
    fleet: Fleet, session: aiohttp.ClientSession, path: str, fields: dict[str, Any], param: str
) -> None:
    body = {"model": MODEL, **fields}
    front = await post(session, url(fleet, "front", path), body)
    worker = await post(session, url(fleet, "inference", path), body)
    assert front[0] == worker[0] == 400, (front, worker)
    assert front[1]["error"]["param"] == worker[1]["error"]["param"] == param
    assert front[1]["error"]["type"] == "invalid_request_error"
    if param != "prompt":  # the worker's engine words the context check its own way
        assert front[1]["error"]["message"] == worker[1]["error"]["message"]
    assert front[2] is None, "the front routed a request it should have refused"
    assert worker[2] is not None


@pytest.mark.parametrize("padding", [OFFLOAD_ABOVE, 3 * 1024 * 1024])
async def test_a_large_body_is_read_off_the_loop_and_served(
    fleet: Fleet, session: aiohttp.ClientSession, padding: int
) -> None:
    # Unknown keys are the worker's to ignore: padding makes the body large, not the prompt.
    body = {"model": MODEL, "prompt": "a large body", "max_tokens": 3, "user": "x" * padding}
    status, answer, worker = await post(session, url(fleet, "front", "/v1/completions"), body)
    assert status == 200, answer
    assert worker is not None
    assert answer["usage"]["completion_tokens"] == 3
    # The same body on the loop's path (the prompt process's answer must agree with it).
    small = {**body, "user": "x"}
    status, again, _ = await post(session, url(fleet, "front", "/v1/completions"), small)
    assert status == 200
    assert again["usage"]["prompt_tokens"] == answer["usage"]["prompt_tokens"]


async def test_a_huge_prompt_is_refused_while_health_answers(
    fleet: Fleet, session: aiohttp.ClientSession
) -> None:
    """A 7 MB prompt is far over the context: refused with the context's rule, and the
    daemon answers ``/health`` while a prompt process tokenizes it."""
    prompt = "the quick brown fox jumps over the lazy dog " * (7_000_000 // 44)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
    refused = asyncio.ensure_future(post(session, url(fleet, "front", "/v1/completions"), body))
    healthy = 0
    while not refused.done():
        async with session.get(url(fleet, "front", "/health")) as reply:
            assert reply.status == 200
            healthy += 1
        await asyncio.sleep(0.01)
    status, answer, worker = await refused
    assert status == 400, answer
    assert answer["error"]["param"] == "prompt"
    assert f"context length of {CONTEXT} tokens" in answer["error"]["message"]
    assert worker is None
    assert healthy > 0
    assert "prompt process started" in fleet.daemon.log


async def test_explain_tokenizes_a_long_prompt_and_bounds_it(fleet: Fleet) -> None:
    async with AsyncClient(f"unix://{fleet.socket}") as client:
        long = "the quick brown fox " * (OFFLOAD_ABOVE // 10)
        info = await client.explain(MODEL, prompt=long)
        assert info.chosen, info.summary
        short = await client.explain(MODEL, prompt="the quick brown fox")
        assert short.chosen == info.chosen
        too_long = "x" * (8 * 1024 * 1024 + 1)
        with pytest.raises(InvalidInputError, match=r"8388609 characters long; at most 8388608"):
            await client.explain(MODEL, prompt=too_long)


@pytest.mark.parametrize("surface", ["front", "inference"])
async def test_nesting_cut_off_is_refused_for_its_depth(
    fleet: Fleet, session: aiohttp.ClientSession, surface: str
) -> None:
    """Unclosed nesting past the JSON parser's own limit is named as nesting, not as a
    parser's internal error."""
    raw = b'{"model": "llama", "prompt": ' + b"[" * 2000
    headers = {"Content-Type": "application/json"}
    async with session.post(url(fleet, surface, "/v1/completions"), data=raw, headers=headers) as r:
        assert r.status == 400
        message = (await r.json())["error"]["message"]
    assert message == "the request body nests arrays or objects more than 64 levels deep"
