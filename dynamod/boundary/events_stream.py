"""Reading one worker's engine events stream (the wire format: ``dynamod.engine_events``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp

from dynamod.engine_events import EngineLoad, KvBatch
from dynamod.errors import InvalidInputError

MAX_LINE = 1 << 16
"""Longest event line accepted (aiohttp's reader limit); a longer one is a protocol
error."""


class FeedError(InvalidInputError):
    """A worker's stream broke the protocol: not JSON, a bad state, a line too long, a gap
    in its KV lines."""


async def events(
    session: aiohttp.ClientSession, url: str, *, stall: float
) -> AsyncIterator[EngineLoad | KvBatch]:
    """The states and KV batches a worker reports at ``url``, in order, until the stream
    ends: the load snapshot first, then (from a worker that offers them) the KV lines that
    carry its whole cache, then whatever changes.

    Raises ``aiohttp.ClientError`` when it cannot be reached or answers anything but 200,
    ``TimeoutError`` when it stays silent ``stall`` seconds (heartbeats count), and
    ``FeedError`` when what it sends breaks the protocol (a KV line out of sequence
    included: the caller reconnects, and the new connection starts whole). Types it does
    not know are skipped (a newer worker's).
    """
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=stall, sock_read=stall)
    async with session.get(url, timeout=timeout, raise_for_status=True) as response:
        reader = response.content
        kv_seq = 0
        while True:
            try:
                line = await reader.readuntil(b"\n")
            except ValueError:  # aiohttp's "Chunk too big": over the reader's limit
                raise FeedError(f"an event from {url} is over {MAX_LINE} bytes") from None
            if not line:
                return
            event = _event_of(line, url)
            if event.get("type") in ("snapshot", "state"):
                yield EngineLoad.from_json(event.get("state"))
            elif event.get("type") == "kv":
                if event.get("seq") != kv_seq:
                    raise FeedError(
                        f"{url} sent KV line {event.get('seq')!r} where {kv_seq} was due"
                    )
                kv_seq += 1
                yield KvBatch.from_json(event)


def _event_of(line: bytes, url: str) -> dict[str, object]:
    try:
        event = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FeedError(f"{url} sent a line that is not JSON: {exc}") from None
    if not isinstance(event, dict):
        raise FeedError(f"{url} sent an event that is not a JSON object")
    return event
