"""The inference routes of an ``--engine openai`` worker: each request is forwarded to the
upstream server beside it, and its answer passed back as it comes.

Why through the worker and not straight from the front to the upstream: the worker then
counts every request in flight (its drain waits for exactly those; a server without
metrics still reports a load), every answer carries ``x-dynamo-worker-id`` and a
draining worker answers 503 as any worker does. The cost is one loopback hop
(``bench/engines.py`` measures it).

``POST /v1/completions`` and ``/v1/chat/completions`` go upstream with the body as sent,
less ``nvext`` (dynamod's routing extension, including the token ids the front adds: an
upstream tokenizes its own prompts). ``GET /v1/models`` answers from the model card.
An upstream that cannot be reached is a 502, one that stays silent a 504; the front then
tries another worker. A client that goes away closes the upstream request with it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from dynamod.http.inflight import Drains
from dynamod.http.openai import (
    CHAT,
    COMPLETIONS,
    WORKER_ID_HEADER,
    error_event,
    error_response,
    sse_event,
)
from dynamod.worker.engines.upstream import UpstreamEngine
from dynamod.worker.inference import models_response

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PASSED_HEADERS = ("Content-Type", "Cache-Control")
READ_TIMEOUT = 300.0
"""Longest silence of the upstream, to answer or between two chunks of a stream."""


class ProxyRoutes(Drains):
    """Forwards inference requests to ``engine``'s upstream; see the module docstring."""

    def __init__(
        self, engine: UpstreamEngine, worker_id: str, *, registry: CollectorRegistry
    ) -> None:
        self._engine = engine
        self._worker_id = worker_id
        self._requests = engine.requests
        self._answered = Counter(
            "dynamo_worker_requests",
            "Inference requests answered, by route and HTTP status.",
            ["route", "status"],
            registry=registry,
        )
        Gauge(
            "dynamo_worker_inflight_requests", "Inference requests in flight.", registry=registry
        ).set_function(lambda: len(self._requests))
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=READ_TIMEOUT)

    def add_to(self, app: web.Application) -> None:
        for api in (COMPLETIONS, CHAT):
            app.router.add_post(api.path, self._forward_as(api.path, api.route))
        app.router.add_get("/v1/models", self._models)
        app.on_response_prepare.append(self._tag)

    async def _tag(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers[WORKER_ID_HEADER] = self._worker_id

    async def _models(self, request: web.Request) -> web.Response:
        return models_response(self._engine.model_card())

    def _forward_as(self, path: str, route: str) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            if self._requests.draining:
                message = "the worker is draining and takes no new requests"
                response: web.StreamResponse = error_response(503, message, "draining")
            else:
                with self._requests.request():
                    response = await self._forward(request, path)
            self._answered.labels(route, str(response.status)).inc()
            return response

        return handler

    async def _forward(self, request: web.Request, path: str) -> web.StreamResponse:
        body = _without_nvext(await request.read())
        url = self._engine.url(path)
        try:
            async with self._engine.session.post(
                url, data=body, headers={"Content-Type": "application/json"}, timeout=self._timeout
            ) as upstream:
                return await _relay(request, upstream)
        except TimeoutError:
            return error_response(504, f"upstream {url} did not answer in time", "upstream_timeout")
        except aiohttp.ClientError as exc:
            return error_response(502, f"upstream {url} failed: {exc}", "upstream_failed")


async def _relay(request: web.Request, upstream: aiohttp.ClientResponse) -> web.StreamResponse:
    headers = {h: upstream.headers[h] for h in PASSED_HEADERS if h in upstream.headers}
    if upstream.content_type != "text/event-stream":
        return web.Response(status=upstream.status, body=await upstream.read(), headers=headers)
    response = web.StreamResponse(status=upstream.status, headers=headers)
    await response.prepare(request)
    try:
        try:
            async for piece in upstream.content.iter_any():
                await response.write(piece)
        except (aiohttp.ClientError, TimeoutError) as exc:
            # Mid-stream the status is sent: end the stream the way a worker does.
            await response.write(
                error_event(f"upstream failed mid-stream: {exc}", "upstream_failed")
            )
            await response.write(sse_event("[DONE]"))
        await response.write_eof()
    except ConnectionResetError:
        log.debug("client went away mid-stream; the upstream request closes with it")
    return response


def _without_nvext(raw: bytes) -> bytes:
    """The body less dynamod's ``nvext`` (unknown keys make some servers log or refuse)."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return raw  # the upstream answers a body it cannot read itself
    if not isinstance(body, dict) or "nvext" not in body:
        return raw
    del body["nvext"]
    return json.dumps(body, separators=(",", ":")).encode()
