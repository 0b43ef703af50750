"""Dynamo 1.6.1's answers of its taint route, as captured (``route_responses.json``),
replayed by a real HTTP server on loopback and read by the daemon's one caller of the
route: each becomes the error its meaning calls for, read within its byte budget."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from dynamod.boundary.taint_route import MAX_ANSWER, post_taints
from dynamod.errors import (
    InvalidInputError,
    OversizeError,
    UnsupportedError,
    UpstreamError,
    WorkerUnavailableError,
)
from tests.dynamo import values
from tests.support.servers import free_port
from tests.support.web import served

CAPTURED: dict[str, dict[str, Any]] = values.captured_json("route_responses.json")


class Replay:
    """Answers every request with ``answer`` (status, content type, body), and keeps the
    bodies it was sent."""

    def __init__(self) -> None:
        self.answer: tuple[int, str, bytes] = (200, "text/plain", b"")
        self.sent: list[object] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.sent.append(json.loads(await request.read()))
        status, kind, body = self.answer
        return web.Response(status=status, body=body, content_type=kind.split(";")[0])

    def replay(self, name: str) -> None:
        found = CAPTURED[name]
        self.answer = (found["status"], found["content_type"], found["body"].encode())


@pytest.fixture
async def route() -> AsyncIterator[Replay]:
    replay = Replay()
    app = web.Application()
    app.router.add_route("*", "/engine/update/model_taints", replay.handle)
    async with served(app) as replay.url:
        yield replay


async def test_ok_gives_the_taints_held_and_the_body_is_the_whole_set(route: Replay) -> None:
    route.replay("dup-unsorted")
    assert await post_taints(route.url, ["b", "a"], worker="w0") == ("a", "b")
    assert route.sent == [{"taints": ["b", "a"]}]


async def test_dynamos_refusal_keeps_its_words(route: Replay) -> None:
    route.replay("reserved-prefix")
    with pytest.raises(InvalidInputError) as caught:
        await post_taints(route.url, ["x"], worker="w0")
    assert (
        str(caught.value)
        == "taint 'dynamo.topology/zone=x' uses reserved prefix 'dynamo.topology/'"
    )


async def test_no_route_says_which_worker_and_why(route: Replay) -> None:
    route.replay("stock_mocker_no_route")
    with pytest.raises(UnsupportedError, match=r"worker w2 has no taint route: .* answered 404"):
        await post_taints(route.url, ["x"], worker="w2")


async def test_starting_or_stopping_is_retryable(route: Replay) -> None:
    message = "engine administrative routes are unavailable while the worker is stopping"
    route.answer = (200, "text/plain", json.dumps({"status": "error", "message": message}).encode())
    with pytest.raises(WorkerUnavailableError, match="while the worker is stopping") as caught:
        await post_taints(route.url, ["x"], worker="w0")
    assert caught.value.retryable and caught.value.worker == "w0"


async def test_an_unexpected_answer_is_an_upstream_error_with_its_status(route: Replay) -> None:
    route.replay("invalid-json")
    with pytest.raises(UpstreamError, match="answered 400") as caught:
        await post_taints(route.url, ["x"], worker="w0")
    assert not caught.value.retryable


async def test_an_answer_over_its_budget_is_not_read(route: Replay) -> None:
    route.answer = (200, "text/plain", b"[" * (MAX_ANSWER + 1))
    with pytest.raises(OversizeError):
        await post_taints(route.url, ["x"], worker="w0")


async def test_no_answer_is_retryable_and_names_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(WorkerUnavailableError) as raised:
        await post_taints(url, ["x"], worker="w0")
    assert str(raised.value) == (
        f"worker w0's taint route at {url}/engine/update/model_taints did not answer: "
        "could not connect (Connection refused)"
    )


async def test_an_unknown_host_says_so_without_aiohttps_words() -> None:
    """aiohttp's text names its TLS context ("ssl:default") and repeats the address as a
    Python tuple; the message says what happened instead."""
    url = "http://no-such-host.invalid:9090"
    with pytest.raises(WorkerUnavailableError) as raised:
        await post_taints(url, ["x"], worker="w0")
    said = str(raised.value)
    assert re.fullmatch(rf"worker w0's taint route at {url}/\S+ did not answer: could not "
                        r"connect \([A-Z][^()]+\)", said), said  # fmt: skip
    assert "ssl:" not in said and "Cannot connect to host" not in said


async def test_a_worker_that_never_answers_is_given_up_within_the_deadline() -> None:
    released = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await released.wait()
        return web.Response(status=500)

    app = web.Application()
    app.router.add_post("/engine/update/model_taints", hang)
    async with served(app) as url:
        try:
            with pytest.raises(WorkerUnavailableError, match=re.escape("no answer within 0.2 s")):
                await post_taints(url, ["x"], worker="w0", within=0.2)
        finally:
            released.set()


async def test_a_worker_without_a_known_system_address_says_how_to_give_one() -> None:
    with pytest.raises(UnsupportedError, match="dynamo_system_address"):
        await post_taints("", ["x"], worker="w0")
