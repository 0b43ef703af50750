"""Reading one worker's engine events stream (the wire format: ``dynamod.engine_events``),
within that worker's budgets (``boundary/budgets.py``), on a connection of its own
(``http/stream_get.py``: a few hundred bytes of objects a stream, where aiohttp's client
took some 14 KB)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from dynamod import jsoncodec
from dynamod.boundary.budgets import Budgets, RateBudget
from dynamod.engine_events import EngineLoad
from dynamod.errors import InvalidInputError
from dynamod.http.bounded import LineReader
from dynamod.http.memory import Claim
from dynamod.http.stream_get import stream_get
from dynamod.kv_events import KvBatch

YIELD_LINES = 16
YIELD_BYTES = 32 << 10
"""A reader lets the event loop run other tasks after this many lines or bytes: lines a
worker sent at once are already buffered, and reading them would otherwise hold the loop
(and ``/health``, and the front) for a whole burst."""


class FeedError(InvalidInputError):
    """A worker's stream broke the protocol: not JSON, a bad state, a gap in its KV lines."""


async def events(
    url: str, budgets: Budgets, rate: RateBudget, claim: Claim | None = None
) -> AsyncGenerator[EngineLoad | KvBatch | None, None]:
    """The states and KV batches a worker reports at ``url``, in order, until the stream
    ends: the load snapshot first, then (from a worker that offers them) the KV lines that
    carry its whole cache, then whatever changes; ``None`` for a line that carries nothing
    to apply (a heartbeat, or a type it does not know: a newer worker's), which still says
    the stream is alive. Every line is paid for from ``rate``.

    Raises a ``ConnectionError`` (an ``OSError``: ``stream_get.StreamUnavailableError``
    among them) when it cannot be reached, answers anything but 200 or breaks the
    connection; ``TimeoutError`` when it does not answer,
    or send a whole line, within ``budgets.stall`` seconds (heartbeats count);
    ``OversizeError`` for a line over ``budgets.line`` bytes, or a head or chunk size line
    over ``stream_get``'s; ``TooFastError`` past its rate budget; ``FeedError`` (an
    ``InvalidInputError``) when what it sends breaks the protocol (a KV line out of sequence
    included: the caller reconnects, and the new connection starts whole), and
    ``stream_get.FramingError`` or ``bounded.EncodingError`` when its HTTP does (both
    ``UpstreamError``s). A line counts as sent in time when it had arrived by the
    deadline, even if the daemon's own loop, starved, only reads it later. ``claim``:
    what waits in its buffer is held on the daemon's memory budget; made to pay,
    ``MemoryBudgetError`` (the daemon's limit, not the worker's fault).
    """
    stall = budgets.stall
    # No total: a stream lasts as long as the worker; each line is bounded instead (not
    # each read: a read's deadline would fail a line that arrived in time on a loop that
    # was starved meanwhile, which ``arrived`` below forgives).
    async with asyncio.timeout(stall):
        body = await stream_get(url)
    if claim is not None:
        claim.stop = lambda _: body.close()
    try:
        lines = LineReader(body, budgets.line, f"the engine events of {url}", claim)
        kv_seq = since_yield = lines_since = 0
        while True:
            try:
                async with asyncio.timeout(stall):
                    line = await lines.next_line()
            except TimeoutError:
                line = lines.arrived()
                if line is None:
                    raise
            if line is None:
                return
            rate.spend(len(line))
            since_yield, lines_since = since_yield + len(line), lines_since + 1
            if since_yield >= YIELD_BYTES or lines_since >= YIELD_LINES:
                await asyncio.sleep(0)
                since_yield = lines_since = 0
            event = _event_of(line, url)
            kind = event.get("type")
            if kind in ("snapshot", "state"):
                yield _load_of(event, url)
            elif kind == "kv":
                if event.get("seq") != kv_seq:
                    raise FeedError(
                        f"{url} sent KV line {event.get('seq')!r:.40} where {kv_seq} was due"
                    )
                kv_seq += 1
                batch = _batch_of(event, url)
                rate.spend_kv(len(batch.events))  # each event is an update of the KV index
                yield batch
            else:
                yield None
    finally:
        body.close()


def _event_of(line: bytes, url: str) -> dict[str, object]:
    try:
        event = jsoncodec.read(line, f"a line from {url}")
    except InvalidInputError as exc:
        raise FeedError(str(exc)) from None
    if not isinstance(event, dict):
        raise FeedError(f"{url} sent an event that is not a JSON object")
    return event


def _load_of(event: dict[str, object], url: str) -> EngineLoad:
    try:
        return EngineLoad.from_json(event.get("state"))
    except InvalidInputError as exc:
        raise FeedError(f"{url} sent a bad state: {exc}") from None


def _batch_of(event: dict[str, object], url: str) -> KvBatch:
    try:
        return KvBatch.from_json(event)
    except InvalidInputError as exc:
        raise FeedError(f"{url} sent a bad KV line: {exc}") from None
