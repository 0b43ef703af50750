"""A model with no worker, against real ``dynamod`` and ``dynamo-worker`` processes: a
request waits for one when the router's ``no_worker_wait`` (here 60 s, by the
environment) or its own ``nvext.max_wait`` asks; without a wait, a model whose last worker
left within ``model_gone_window`` gets a retryable 503, and one never served a 404."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.eventually import eventually
from tests.support.processes import Proc, daemon, running, worker

WITHIN = 60.0
"""How long a test waits for an outcome; never a measure of the daemon's speed."""


@pytest.fixture
async def front(tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    store = (tmp_path / "store").as_uri()
    env = {"DYNAMO_ROUTER_NO_WORKER_WAIT": "60"}
    async with running(daemon(store, tmp_path / "d.sock", **env)) as proc:
        yield proc.field("http"), store


async def complete(
    http: aiohttp.ClientSession, front: str, model: str, **nvext: Any
) -> aiohttp.ClientResponse:
    body: dict[str, Any] = {"model": model, "prompt": "hello", "max_tokens": 2}
    if nvext:
        body["nvext"] = nvext
    reply = await http.post(front + "/v1/completions", json=body)
    await reply.read()
    return reply


async def until(check: Any) -> None:
    await eventually(check, within=WITHIN, every=0.05)


async def listed(http: aiohttp.ClientSession, front: str, model: str) -> bool:
    async with http.get(front + "/v1/models") as reply:
        return model in {m["id"] for m in (await reply.json())["data"]}


async def test_a_request_waits_for_a_model_to_get_a_worker(front: tuple[str, str]) -> None:
    url, store = front
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WITHIN)) as http:
        waiting = asyncio.ensure_future(complete(http, url, "late"))  # no_worker_wait: 60
        by_request = asyncio.ensure_future(complete(http, url, "late", max_wait=50))
        await until(lambda: _depth(http, url, "late", 2))
        assert not waiting.done() and not by_request.done()
        async with running(worker(store, model="late")):
            for reply in (await waiting, await by_request):
                assert reply.status == 200, await reply.text()
                assert (await reply.json())["usage"]["completion_tokens"] == 2


async def test_a_model_that_just_lost_its_worker_is_retryable(front: tuple[str, str]) -> None:
    url, store = front
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WITHIN)) as http:
        proc: Proc
        async with running(worker(store, model="brief")) as proc:
            await until(lambda: listed(http, url, "brief"))
            assert (await complete(http, url, "brief", max_wait=0)).status == 200
            await proc.stop()
        await until(lambda: _not(listed(http, url, "brief")))
        gone = await complete(http, url, "brief", max_wait=0)
        assert gone.status == 503
        assert gone.headers["Retry-After"] == "1"
        error = (await gone.json())["error"]
        assert error["code"] == "model_unavailable"
        assert "'brief' has no worker now" in error["message"]
        never = await complete(http, url, "never", max_wait=0)
        assert never.status == 404
        assert (await never.json())["error"]["code"] == "model_not_found"
        assert "Retry-After" not in never.headers


async def _depth(http: aiohttp.ClientSession, front: str, model: str, depth: int) -> bool:
    async with http.get(front + "/metrics") as reply:
        text = await reply.text()
    return f'dynamod_router_queue_depth{{model="{model}"}} {float(depth)}' in text


async def _not(check: Any) -> bool:
    return not await check
