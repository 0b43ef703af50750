"""What a worker publishes about its engine on its system port, for the daemons.

* ``GET /engine/events``: the engine's state as a stream of newline-delimited JSON events
  (the wire format is ``dynamod.reported``'s docstring): a snapshot first, then a state
  each time the engine says it changed (``Engine.changes``), at most one per
  ``min_interval`` (changes in between are folded into the next), and a heartbeat after
  ``heartbeat`` seconds of silence. It ends when the client goes or the server closes.
* ``GET /engine/tokenizer``: the engine's tokenizer bundle (``tokenizers/bundle.py``),
  the bytes whose checksum the model card names.
"""

from __future__ import annotations

import asyncio
import json
import logging

from aiohttp import web

from dynamod.reported import EVENTS_PATH, HEARTBEAT, EngineLoad
from dynamod.tokenizers.bundle import PATH as TOKENIZER_PATH
from dynamod.tokenizers.bundle import published
from dynamod.worker.engines.base import Backend, EngineStats

log = logging.getLogger(__name__)

MIN_INTERVAL = 0.01
"""Seconds between two state events of one stream: a step-by-step engine would otherwise
send one per step."""


def engine_load(stats: EngineStats) -> EngineLoad:
    """An engine's stats as the value a worker reports."""
    total = stats.kv_blocks_total
    return EngineLoad(
        running=stats.active_requests,
        waiting=stats.waiting_requests,
        kv_usage=stats.kv_blocks_used / total if total else 0.0,
        kv_blocks_used=stats.kv_blocks_used,
        kv_blocks_total=total,
        prefix_cache_hits=stats.prefix_cache_hits,
        prefix_cache_queries=stats.prefix_cache_queries,
        healthy=stats.healthy,
        reason=stats.reason,
        source=stats.source,
    )


class EnginePublisher:
    """The engine routes of a worker's system server; see the module docstring."""

    def __init__(
        self,
        engine: Backend,
        *,
        heartbeat: float = HEARTBEAT,
        min_interval: float = MIN_INTERVAL,
    ) -> None:
        self._engine = engine
        self._heartbeat = heartbeat
        self._min_interval = min_interval
        self._tokenizer = published(engine.tokenizer)
        self._stop = asyncio.Event()

    def close(self) -> None:
        """End every events stream now (the worker is shutting down; its record is gone, so
        daemons stop following it anyway) instead of when the server's shutdown cancels
        them."""
        self._stop.set()
        self._engine.changes.changed()  # wakes every stream, which then sees _stop

    def add_to(self, app: web.Application) -> None:
        app.router.add_get(EVENTS_PATH, self._events)
        app.router.add_get(TOKENIZER_PATH, self._tokenizer_bundle)

    def state(self) -> EngineLoad:
        return engine_load(self._engine.stats())

    async def _tokenizer_bundle(self, request: web.Request) -> web.Response:
        return web.Response(body=self._tokenizer, content_type="application/json")

    async def _events(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        changes = self._engine.changes
        try:
            seen = changes.version
            await _send(response, seen, "snapshot", self.state())
            while not self._stop.is_set():
                try:
                    async with asyncio.timeout(self._heartbeat):
                        await changes.wait_past(seen)
                except TimeoutError:
                    await _send(response, seen, "heartbeat", None)
                    continue
                if self._stop.is_set():
                    break
                seen = changes.version
                await _send(response, seen, "state", self.state())
                await asyncio.sleep(self._min_interval)
            await response.write_eof()
        except ConnectionResetError:
            log.debug("engine events subscriber %s went away", request.remote)
        return response


async def _send(
    response: web.StreamResponse, seq: int, kind: str, state: EngineLoad | None
) -> None:
    event: dict[str, object] = {"seq": seq, "type": kind}
    if state is not None:
        event["state"] = state.to_json()
    await response.write(json.dumps(event, separators=(",", ":")).encode() + b"\n")
