"""The one bounded reader (``dynamod.http.bounded``) against a real aiohttp server: lines
and bodies within their budget come through whole, one byte more is refused by name, and
an announced length over the budget is refused before the body is read."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from dynamod.errors import OversizeError
from dynamod.http.bounded import LineReader, read_body
from tests.front.conftest import Handler, Serve


def streamed(*pieces: bytes) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for piece in pieces:
            await response.write(piece)
        await response.write_eof()
        return response

    return handler


async def lines_of(url: str, limit: int) -> list[bytes]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        reader = LineReader(response.content, limit, "the test stream")
        lines = []
        while (line := await reader.next_line()) is not None:
            lines.append(line)
        return lines


async def test_lines_within_the_limit_come_whole_across_chunks(serve: Serve) -> None:
    url = await serve(streamed(b"ab", b"c\nde", b"f\n", b"x" * 9 + b"\n", b"tail"))
    assert await lines_of(url, 10) == [b"abc\n", b"def\n", b"x" * 9 + b"\n", b"tail"]


async def test_a_line_one_byte_over_the_limit_is_refused_by_name(serve: Serve) -> None:
    url = await serve(streamed(b"ok\n", b"y" * 10 + b"\n", b"never read\n"))
    with pytest.raises(OversizeError, match="a line of the test stream is over its limit of 10"):
        await lines_of(url, 10)


async def test_an_endless_line_is_refused_without_reading_it_all(serve: Serve) -> None:
    url = await serve(streamed(*[b"z" * 65536] * 200))  # 13 MB, no newline
    with pytest.raises(OversizeError):
        await lines_of(url, 1 << 20)


async def test_a_body_over_its_budget_is_refused(serve: Serve) -> None:
    url = await serve(streamed(b"a" * 1000, b"b" * 1000))
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        with pytest.raises(OversizeError, match="the answer is over its limit of 1500 bytes"):
            await read_body(response, 1500, "the answer")
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert await read_body(response, 2000, "the answer") == b"a" * 1000 + b"b" * 1000


async def test_an_announced_length_over_the_budget_is_refused_before_reading(serve: Serve) -> None:
    async def big(request: web.Request) -> web.Response:
        return web.Response(body=b"q" * 5000)

    url = await serve(big)
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        with pytest.raises(OversizeError, match=r"the bundle \(5000 bytes announced\)"):
            await read_body(response, 4096, "the bundle")
