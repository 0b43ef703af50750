"""Whole SSE events, each bounded (``dynamod.http.sse.EventReader``), against a real aiohttp
server: events come through whole whatever the network chunks, an event one byte over
its limit is refused by name, and a stream cut mid-event says how much it dropped."""

from __future__ import annotations

import aiohttp
import pytest

from dynamod.errors import OversizeError
from dynamod.http.sse import EventReader, is_done
from tests.front.conftest import Serve
from tests.front.test_bounded_reader import streamed

pytestmark = pytest.mark.timeout(30)

ONE = b'data: {"a":1}\n\n'
CRLF = b'data: {"b":2}\r\n\r\n'
DONE = b"data: [DONE]\n\n"


async def events_of(url: str, limit: int) -> tuple[list[bytes], int]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        reader = EventReader(response.content, limit, "the test stream")
        found = []
        while (event := await reader.next_event()) is not None:
            found.append(event)
        return found, reader.partial


async def test_events_come_whole_whatever_the_chunks(serve: Serve) -> None:
    # Split mid-line and mid-blank-line, with a CRLF event and blank lines between events.
    pieces = (ONE[:5], ONE[5:-1], ONE[-1:] + b"\n" + CRLF[:-2], CRLF[-2:] + DONE)
    url = await serve(streamed(*pieces))
    assert await events_of(url, len(CRLF)) == ([ONE, CRLF, DONE], 0)
    assert is_done(DONE) and is_done(b"data:[DONE]\r\n\r\n") and not is_done(ONE)


async def test_an_event_one_byte_over_its_limit_is_refused(serve: Serve) -> None:
    url = await serve(streamed(ONE, b"data: " + b"x" * 100 + b"\n\n"))
    with pytest.raises(OversizeError, match="an event of the test stream is over its limit of 50"):
        await events_of(url, 50)
    long_lines = b"data: 1\n" * 20 + b"\n"  # many short lines: the event's total counts
    url = await serve(streamed(long_lines))
    with pytest.raises(OversizeError, match="an event of the test stream"):
        await events_of(url, 100)


async def test_a_stream_cut_mid_event_drops_the_half_and_says_so(serve: Serve) -> None:
    url = await serve(streamed(ONE, b'data: {"a":', b"2}\n"))
    assert await events_of(url, 1000) == ([ONE], len(b'data: {"a":2}\n'))
