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

The upstream's answers are read bounded (``UpstreamConfig.limits``): a whole answer of at
most ``limits.whole`` bytes (``http.bounded.read_body``), a stream event by event, each
whole and at most ``limits.event`` bytes (``http.sse.EventReader``). The client's answer
starts with the whole body or with the stream's first whole event, so an answer over its
limit, cut off or silent before then is a 502 (504) naming the upstream, in OpenAI's
shape, which the front may retry elsewhere. After it, a stream that fails ends with one
error event and ``[DONE]``; a partial event is never passed on (half a JSON object glued
to the error event would be garbage). Every such failure is one log line.

Shutdown: ``cut_streams(message)`` ends every stream being relayed with an error event
(code ``shutting_down``) and ``[DONE]``, as the daemon's front does at the end of its
grace; the runtime calls it when the worker's grace ends with streams still open.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from dynamod import jsoncodec
from dynamod.errors import InvalidInputError, OversizeError
from dynamod.http.bounded import read_body
from dynamod.http.inflight import Drains
from dynamod.http.limits import AnswerLimits
from dynamod.http.openai import (
    CHAT,
    COMPLETIONS,
    WORKER_ID_HEADER,
    error_event,
    error_response,
)
from dynamod.http.server import Handler
from dynamod.http.sse import DONE_EVENT, EventReader, OpenStream, OpenStreams, is_done
from dynamod.worker.engines.upstream import UpstreamEngine
from dynamod.worker.inference import models_response

log = logging.getLogger(__name__)

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
        self._streams = OpenStreams()

    def cut_streams(self, message: str) -> int:
        """End every stream being relayed with an error event (``message``, code
        ``shutting_down``) and ``[DONE]``, as their handlers' next step; how many there
        were."""
        return self._streams.cut(message)

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
                if upstream.content_type == "text/event-stream":
                    return await self._relay_stream(request, upstream, url)
                return await _relay_whole(upstream, url, self._engine.config.limits)
        except TimeoutError:
            return _failed(504, f"upstream {url} did not answer in time", "upstream_timeout")
        except aiohttp.ClientError as exc:
            return _failed(502, f"upstream {url} failed: {exc}", "upstream_failed")

    async def _relay_stream(
        self, request: web.Request, upstream: aiohttp.ClientResponse, url: str
    ) -> web.StreamResponse:
        limit = self._engine.config.limits.event
        events = EventReader(upstream.content, limit, f"the stream of upstream {url}")
        with self._streams.opened(upstream) as stream:
            first = await _next(events, stream, url)
            if isinstance(first, _Broken):
                if stream.cut is not None:
                    return error_response(503, stream.cut, "shutting_down")
                return _failed(first.status, first.message, first.code)
            response = web.StreamResponse(status=upstream.status, headers=_headers(upstream))
            try:
                await response.prepare(request)
                await _pump(response, first, events, stream, url)
                await response.write_eof()
            except ConnectionResetError:
                log.debug("client went away mid-stream; the upstream request closes with it")
        return response


@dataclass(frozen=True)
class _Broken:
    """Why an upstream's stream has no next event: the answer's status, code and message."""

    status: int
    code: str
    message: str


async def _relay_whole(
    upstream: aiohttp.ClientResponse, url: str, limits: AnswerLimits
) -> web.Response:
    try:
        body = await read_body(upstream, limits.whole, f"the answer of upstream {url}")
    except OversizeError as exc:
        return _failed(502, f"upstream {url} sent too large an answer: {exc}", "upstream_failed")
    return web.Response(status=upstream.status, body=body, headers=_headers(upstream))


async def _next(events: EventReader, stream: OpenStream, url: str) -> bytes | _Broken:
    """The next whole event of the upstream's stream, or why there is none."""
    try:
        event = await events.next_event()
    except OversizeError as exc:
        return _Broken(502, "upstream_failed", f"upstream {url} sent too large an event: {exc}")
    except TimeoutError:
        return _Broken(504, "upstream_timeout", f"upstream {url} went silent mid-stream")
    except aiohttp.ClientError as exc:
        return _Broken(502, "upstream_failed", f"upstream {url} failed mid-stream: {exc}")
    if event is not None and stream.cut is None:
        return event
    dropped = f" ({events.partial} bytes of a last event dropped)" if events.partial else ""
    said = f"upstream {url} ended the stream without [DONE]{dropped}"
    return _Broken(502, "upstream_failed", said)


async def _pump(
    response: web.StreamResponse, event: bytes, events: EventReader, stream: OpenStream, url: str
) -> None:
    """Pass whole events on until ``[DONE]``; a stream that breaks first ends with one error
    event and ``[DONE]``, the shape a worker uses (``shutting_down`` when it was cut)."""
    while True:
        await response.write(event)
        if is_done(event):
            return
        found = await _next(events, stream, url)
        if isinstance(found, _Broken):
            if stream.cut is not None:
                await response.write(error_event(stream.cut, "shutting_down"))
            else:
                log.warning("%s", found.message)
                await response.write(error_event(found.message, found.code))
            await response.write(DONE_EVENT)
            return
        event = found


def _failed(status: int, message: str, code: str) -> web.Response:
    log.warning("%s", message)
    return error_response(status, message, code)


def _headers(upstream: aiohttp.ClientResponse) -> dict[str, str]:
    return {h: upstream.headers[h] for h in PASSED_HEADERS if h in upstream.headers}


def _without_nvext(raw: bytes) -> bytes:
    """The body less dynamod's ``nvext`` (unknown keys make some servers log or refuse)."""
    try:
        body = jsoncodec.read(raw)
    except InvalidInputError:
        return raw  # the upstream answers a body it cannot read itself
    if not isinstance(body, dict) or "nvext" not in body:
        return raw
    del body["nvext"]
    return jsoncodec.write(body)
