"""Reading one worker's engine events stream (the wire format: ``dynamod.reported``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp

from dynamod.errors import InvalidInputError
from dynamod.reported import EngineLoad

MAX_LINE = 1 << 16
"""Longest event line accepted (aiohttp's reader limit); a longer one is a protocol
error."""


class FeedError(InvalidInputError):
    """A worker's stream broke the protocol: not JSON, a bad state, a line too long."""


async def states(
    session: aiohttp.ClientSession, url: str, *, stall: float
) -> AsyncIterator[EngineLoad]:
    """The states a worker reports at ``url``, the snapshot first, until the stream ends.

    Raises ``aiohttp.ClientError`` when it cannot be reached or answers anything but 200,
    ``TimeoutError`` when it stays silent ``stall`` seconds (heartbeats count), and
    ``FeedError`` when what it sends breaks the protocol. Types it does not know are
    skipped (a newer worker's).
    """
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=stall, sock_read=stall)
    async with session.get(url, timeout=timeout, raise_for_status=True) as response:
        reader = response.content
        while True:
            try:
                line = await reader.readuntil(b"\n")
            except ValueError:  # aiohttp's "Chunk too big": over the reader's limit
                raise FeedError(f"an event from {url} is over {MAX_LINE} bytes") from None
            if not line:
                return
            state = _state_of(line, url)
            if state is not None:
                yield state


def _state_of(line: bytes, url: str) -> EngineLoad | None:
    try:
        event = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FeedError(f"{url} sent a line that is not JSON: {exc}") from None
    if not isinstance(event, dict):
        raise FeedError(f"{url} sent an event that is not a JSON object")
    if event.get("type") in ("snapshot", "state"):
        return EngineLoad.from_json(event.get("state"))
    return None
