"""What a worker publishes about its engine on its system port, for the daemons.

* ``GET /engine/events``: the engine's state, and its KV cache events when it publishes
  them, as a stream of newline-delimited JSON events (the wire format is
  ``dynamod.engine_events``'s docstring): a load snapshot first, then (KV) the engine's whole
  cache as the worker knows it, then a state each time the engine says it changed
  (``Engine.changes``), at most one per ``min_interval`` (changes in between are folded
  into the next), every KV batch as soon as the engine publishes it (not held back by
  that interval: a router should learn a cached block at once), and a heartbeat after
  ``heartbeat`` seconds of silence. It ends when the client goes or the server closes.
* ``GET /engine/tokenizer``: the engine's tokenizer bundle (``tokenizers/bundle.py``),
  the bytes whose checksum the model card names.
* ``POST /engine/reset_prefix_cache``: empty the engine's prefix cache (vLLM's route of
  that name): 200 ``{"status": "ok"}``, or 409 when the engine refused (requests hold
  blocks). It takes the system port's bearer token, as the taint route does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

from dynamod import jsoncodec
from dynamod.engine_events import EVENTS_PATH, HEARTBEAT, EngineLoad
from dynamod.kv_events import KvBatch
from dynamod.tasks import race
from dynamod.tokenizers.bundle import PATH as TOKENIZER_PATH
from dynamod.tokenizers.bundle import published
from dynamod.worker.engines.base import EngineStats, WorkerEngine
from dynamod.worker.engines.kvevents import KvSubscription

log = logging.getLogger(__name__)

MIN_INTERVAL = 0.01
"""Seconds between two state events of one stream: a step-by-step engine would otherwise
send one per step."""
RESET_PATH = "/engine/reset_prefix_cache"

Authorize = Callable[[web.Request], web.Response | None]


def engine_load(stats: EngineStats) -> EngineLoad:
    """An engine's stats as the value a worker reports; ``InvalidInputError`` when they are
    not a load at all (a negative or huge count: ``EngineLoad`` says which)."""
    total = stats.kv_blocks_total
    return EngineLoad(
        running=stats.active_requests,
        waiting=stats.waiting_requests,
        kv_usage=stats.kv_blocks_used / total if total > 0 else 0.0,
        kv_blocks_used=stats.kv_blocks_used,
        kv_blocks_total=total,
        prefix_cache_hits=stats.prefix_cache_hits,
        prefix_cache_queries=stats.prefix_cache_queries,
        healthy=stats.healthy,
        reason=stats.reason,
        source=stats.source,
    )


class EnginePublisher:
    """The engine routes of a worker's system server; see the module docstring.

    ``authorize`` checks a mutating request (the system port's token); None lets all in.
    """

    def __init__(
        self,
        engine: WorkerEngine,
        *,
        heartbeat: float = HEARTBEAT,
        min_interval: float = MIN_INTERVAL,
        authorize: Authorize | None = None,
    ) -> None:
        self._engine = engine
        self._heartbeat = heartbeat
        self._min_interval = min_interval
        self._authorize = authorize
        self._tokenizer = published(engine.tokenizer)
        self._stop = asyncio.Event()
        self._fault = ""

    def close(self) -> None:
        """End every events stream now (the worker is shutting down; its record is gone, so
        daemons stop following it anyway) instead of when the server's shutdown cancels
        them."""
        self._stop.set()
        self._engine.changes.changed()  # wakes every stream, which then sees _stop

    def add_to(self, app: web.Application) -> None:
        app.router.add_get(EVENTS_PATH, self._events)
        app.router.add_get(TOKENIZER_PATH, self._tokenizer_bundle)
        app.router.add_post(RESET_PATH, self._reset)

    def state(self) -> EngineLoad:
        """The engine's load; when its stats cannot be read or are no load (an upstream's
        metrics said ``+Inf``), an unhealthy state that says so: a daemon learns why, and
        the stream goes on."""
        try:
            return engine_load(self._engine.stats())
        except (ArithmeticError, ValueError) as exc:
            reason = f"its engine's stats are not a load: {exc}"
            if reason != self._fault:  # one line per fault, not one per state sent
                log.warning("%s", reason)
                self._fault = reason
            return EngineLoad(healthy=False, reason=reason, source="worker")

    async def _tokenizer_bundle(self, request: web.Request) -> web.Response:
        return web.Response(body=self._tokenizer, content_type="application/json")

    async def _reset(self, request: web.Request) -> web.Response:
        refused = self._authorize(request) if self._authorize is not None else None
        if refused is not None:
            return refused
        if await self._engine.reset_prefix_cache():
            return web.json_response({"status": "ok"})
        message = "the engine did not empty its prefix cache: requests hold blocks"
        return web.json_response({"error": "Conflict", "message": message}, status=409)

    async def _events(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        kv = self._engine.kv_events
        try:
            if kv is None:
                await self._stream(response, None)
            else:
                with kv.subscribe() as subscription:
                    await self._stream(response, subscription)
            await response.write_eof()
        except ConnectionResetError:
            log.debug("engine events subscriber %s went away", request.remote)
        return response

    async def _stream(self, response: web.StreamResponse, kv: KvSubscription | None) -> None:
        changes = self._engine.changes
        seen = changes.version
        await _send(response, {"seq": seen, "type": "snapshot", "state": self.state().to_json()})
        kv_seq = 0
        quiet_until = 0.0  # no state line before then (min_interval)
        while not self._stop.is_set():
            for batch in kv.take() if kv is not None else ():
                await _send_kv(response, kv_seq, batch)
                kv_seq += 1
            now = time.monotonic()
            due = changes.version > seen
            if due and now >= quiet_until:
                seen = changes.version
                await _send(
                    response, {"seq": seen, "type": "state", "state": self.state().to_json()}
                )
                quiet_until = now + self._min_interval
                continue
            waits: list[Coroutine[Any, Any, None]] = [] if due else [changes.wait_past(seen)]
            if kv is not None:
                waits.append(kv.wait())
            try:
                async with asyncio.timeout(quiet_until - now if due else self._heartbeat):
                    await (race(*waits) if waits else asyncio.Event().wait())
            except TimeoutError:
                if not due:
                    await _send(response, {"seq": seen, "type": "heartbeat"})


async def _send(response: web.StreamResponse, event: dict[str, object]) -> None:
    # NaN and Infinity are not JSON: EngineLoad refuses them, and nothing else may send one.
    await response.write(jsoncodec.write(event) + b"\n")


async def _send_kv(response: web.StreamResponse, seq: int, batch: KvBatch) -> None:
    await _send(response, batch.to_json(seq))
