"""Hostile HTTP clients against every HTTP surface: the daemon's front, the worker's
inference routes and the worker's system port.

Each case is refused with the surface's own error (400 / 401 / 408 / 413) and nothing
worse: no 500, no traceback, a malformed request is one warning line, and a slow client is
cut off instead of holding its connection. The processes run with 1 s head and body
bounds (``conftest.py``); the tests wait far longer than that for the outcome and never
time the server.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.hostile.conftest import TOKEN, Fleet

SURFACES = ("front", "inference", "system")
PATHS = {
    "front": "/v1/completions",
    "inference": "/v1/completions",
    "system": "/engine/update/model_taints",
}
OUTCOME_WITHIN = 30.0
"""How long a test waits for the server's answer; far beyond the 1 s bounds under test."""


async def exchange(fleet: Fleet, surface: str, *parts: bytes, pause: float = 0.0) -> bytes:
    """Send ``parts`` to ``surface`` (``pause`` seconds apart, while the server listens),
    then read until it closes the connection. Returns what it sent back."""
    host, port = fleet.address(surface)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        async with asyncio.timeout(OUTCOME_WITHIN):
            reading = asyncio.ensure_future(reader.read())
            for part in parts:
                if reading.done():
                    break  # the server already gave up on us
                writer.write(part)
                await writer.drain()
                await asyncio.wait([reading], timeout=pause)
            return await reading
    finally:
        writer.close()
        with_errors = (ConnectionError, OSError)
        try:
            await writer.wait_closed()
        except with_errors:
            pass


def status(reply: bytes) -> int:
    assert reply.startswith(b"HTTP/1."), f"not an HTTP answer: {reply[:200]!r}"
    return int(reply.split(b" ", 2)[1])


def body(reply: bytes) -> dict[str, object]:
    """The first answer's JSON body (a second answer, e.g. a 408 for bytes the client sent
    after the first, may follow it on the connection)."""
    headers, _, rest = reply.partition(b"\r\n\r\n")
    length = int(headers.lower().partition(b"content-length: ")[2].split(b"\r\n")[0])
    loaded: dict[str, object] = json.loads(rest[:length])
    return loaded


def message(surface: str, reply: bytes) -> str:
    """The error message, in the surface's own error shape."""
    parsed = body(reply)
    error = parsed["error"]
    text = parsed["message"] if surface == "system" else error["message"]  # type: ignore[index]
    assert isinstance(text, str)
    return text


def head(surface: str, length: int, *extra: str) -> bytes:
    lines = [f"POST {PATHS[surface]} HTTP/1.1", "Host: test", f"Content-Length: {length}"]
    lines += ["Content-Type: application/json", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.parametrize("surface", SURFACES)
async def test_a_head_sent_a_byte_at_a_time_is_cut_off_with_408(fleet: Fleet, surface: str) -> None:
    start = f"POST {PATHS[surface]} HTTP/1.1\r\nHost: test\r\nX-Slow: ".encode()
    drip = [start, *(b"a" for _ in range(200))]  # 200 bytes at 0.1 s: 20 s if not cut off
    reply = await exchange(fleet, surface, *drip, pause=0.1)
    assert status(reply) == 408
    assert b"Connection: close" in reply


@pytest.mark.parametrize("surface", SURFACES)
async def test_a_connection_that_never_sends_a_request_is_closed(
    fleet: Fleet, surface: str
) -> None:
    assert status(await exchange(fleet, surface)) == 408


@pytest.mark.parametrize("surface", SURFACES)
async def test_a_body_announced_and_never_sent_gets_408_in_the_surfaces_shape(
    fleet: Fleet, surface: str
) -> None:
    reply = await exchange(fleet, surface, head(surface, 1000), b'{"taints": [')
    assert status(reply) == 408
    assert "did not arrive within 1 s" in message(surface, reply)


@pytest.mark.parametrize("surface", SURFACES)
async def test_an_idle_kept_alive_connection_is_closed(fleet: Fleet, surface: str) -> None:
    path = "/health" if surface == "system" else "/v1/models"
    request = f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode()
    reply = await exchange(fleet, surface, request)  # then idle until the server closes
    assert status(reply) == 200
    assert reply.count(b"HTTP/1.1 ") == 1, "one answer, then the close"


@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize(
    "garbage",
    [
        b"GARBAGE\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET / HTTP/1.1\r\n" + b"X-Long: " + b"a" * 20_000 + b"\r\n\r\n",
        b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(300)) + b"\r\n",
    ],
    ids=["not-http", "bad-length", "bad-chunk", "long-header", "many-headers"],
)
async def test_malformed_http_is_a_400_and_one_warning_line(
    fleet: Fleet, surface: str, garbage: bytes
) -> None:
    reply = await exchange(fleet, surface, garbage)
    assert status(reply) in (400, 431)
    log = (fleet.daemon if surface == "front" else fleet.worker).log
    assert "Traceback" not in log and "Error handling request" not in log, log[-2000:]


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("surface", SURFACES)
async def test_deeply_nested_json_is_a_400_naming_the_limit(fleet: Fleet, surface: str) -> None:
    field = "taints" if surface == "system" else "prompt"
    payload = f'{{"model": "llama", "{field}": {nested(30_000)}}}'.encode()  # under 64 KiB
    auth = f"Authorization: Bearer {TOKEN}"
    reply = await exchange(fleet, surface, head(surface, len(payload), auth) + payload)
    assert status(reply) == 400
    assert "more than 64 levels deep" in message(surface, reply)


async def test_a_non_ascii_bearer_token_is_refused_with_401(fleet: Fleet) -> None:
    payload = b'{"taints": ["a"]}'
    raw = head("system", len(payload))[:-2] + "Authorization: Bearer tök\r\n\r\n".encode()
    reply = await exchange(fleet, "system", raw + payload)
    assert status(reply) == 401
    assert message("system", reply) == "the bearer token is not valid"
