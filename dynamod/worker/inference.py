"""The worker's OpenAI-compatible inference routes, on an aiohttp application.

``InferenceRoutes(engine, worker_id).add_to(app)`` serves:

* ``POST /v1/completions`` and ``POST /v1/chat/completions``: streamed as server-sent
  events ending with ``data: [DONE]`` when ``stream`` is true, one JSON body otherwise.
  ``usage`` carries ``prompt_tokens_details.cached_tokens`` (prompt tokens served from the
  engine's prefix cache); a stream ends with a usage chunk when
  ``stream_options.include_usage`` is true.
* ``GET /v1/models``: the one model this worker serves.

Every response of the application, errors included, carries ``x-dynamo-worker-id``.
Errors are OpenAI-shaped JSON (``{"error": {"message", "type", "param", "code"}}``):
400 for a malformed body or a request the engine refuses, 404 for another model's name,
503 while draining. The body's fields are checked by ``http.openai.sampling``, the very
checks the daemon's front makes before routing. Unknown body keys (``nvext``, ``user``,
...) are ignored. An error after a stream has started becomes one ``data: {"error": ...}``
event before ``[DONE]``.

Shutdown: ``begin_drain()`` refuses new inference requests with 503 while in-flight ones
continue; ``wait_idle()`` returns once none is in flight. A client that disconnects
mid-stream is noticed at the next write; closing the engine stream then frees its slot.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from dynamod.errors import InvalidInputError, ShuttingDownError
from dynamod.http.inflight import Drains, RequestTracker
from dynamod.http.openai import (
    CHAT,
    COMPLETIONS,
    WORKER_ID_HEADER,
    FieldError,
    OpenAIApi,
    Sampling,
    brief,
    check_fits,
    error_body,
    error_response,
    json_object,
    json_response,
    sampling,
    sse_event,
)
from dynamod.jsoncodec import Json
from dynamod.records import ModelCard
from dynamod.worker.engines.base import Chunk, Engine, GenerateRequest, Usage

log = logging.getLogger(__name__)


class _ModelNotFound(Exception):
    """The request names a model this worker does not serve (answered with 404)."""


class _Metrics:
    """Per-request counters on the registry the worker exposes at ``/metrics``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "dynamo_worker_requests",
            "Inference requests answered, by route and HTTP status.",
            ["route", "status"],
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "dynamo_worker_prompt_tokens", "Prompt tokens of served requests.", registry=registry
        )
        self.cached_tokens = Counter(
            "dynamo_worker_cached_tokens",
            "Prompt tokens served from the prefix cache.",
            registry=registry,
        )
        self.completion_tokens = Counter(
            "dynamo_worker_completion_tokens", "Tokens generated.", registry=registry
        )
        self.in_flight = Gauge(
            "dynamo_worker_inflight_requests", "Inference requests in flight.", registry=registry
        )
        self._answered: dict[tuple[str, int], Counter] = {}

    def answered(self, route: str, status: int) -> None:
        # labels() takes a lock and builds a key at every call: once per series is enough.
        counter = self._answered.get((route, status))
        if counter is None:
            counter = self._answered[route, status] = self.requests.labels(route, str(status))
        counter.inc()

    def served(self, usage: Usage) -> None:
        self.prompt_tokens.inc(usage.prompt_tokens)
        self.cached_tokens.inc(usage.cached_tokens)
        self.completion_tokens.inc(usage.completion_tokens)


class InferenceRoutes(Drains):
    """The inference routes of one worker, with drain support and metrics."""

    def __init__(
        self, engine: Engine, worker_id: str, *, registry: CollectorRegistry | None = None
    ) -> None:
        self._engine = engine
        self._worker_id = worker_id
        self._metrics = _Metrics(registry if registry is not None else CollectorRegistry())
        self._requests = RequestTracker(self._metrics.in_flight)

    def cut_streams(self, message: str) -> int:
        """Returns 0: these routes relay no upstream's streams; theirs end as the engine
        and the server stop, right after the grace."""
        return 0

    def add_to(self, app: web.Application) -> None:
        """Mount the routes, and tag every response of ``app`` with the worker id."""
        app.router.add_post(COMPLETIONS.path, self._completions)
        app.router.add_post(CHAT.path, self._chat)
        app.router.add_get("/v1/models", self._models)
        app.on_response_prepare.append(self._tag)

    async def _tag(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers[WORKER_ID_HEADER] = self._worker_id

    async def _models(self, request: web.Request) -> web.Response:
        return models_response(self._engine.model_card())

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, COMPLETIONS)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, CHAT)

    async def _serve(self, request: web.Request, api: OpenAIApi) -> web.StreamResponse:
        response: web.StreamResponse
        if self._requests.draining:
            message = "the worker is draining and takes no new requests"
            response = error_response(503, message, "draining")
        else:
            with self._requests.request():
                response = await self._answer(request, api)
        self._metrics.answered(api.route, response.status)
        return response

    async def _answer(self, request: web.Request, api: OpenAIApi) -> web.StreamResponse:
        reply_id = api.new_id()
        try:
            body = json_object(await request.read())
            wanted = sampling(body, api)
            prompt_ids = api.prompt(body, self._engine.tokenizer)
            self._check_model(wanted.model)
            # The engine refuses these too; checked here, they get the front's very answer.
            check_fits(len(prompt_ids), wanted, self._engine.model_card().context_length, api)
            chunks = self._engine.generate(_generate_request(request, reply_id, prompt_ids, wanted))
        except FieldError as exc:
            return error_response(exc.status, str(exc), "invalid_value", param=exc.param)
        except InvalidInputError as exc:
            return error_response(400, str(exc), "invalid_value")
        except _ModelNotFound as exc:
            return error_response(404, str(exc), "model_not_found")
        reply = _Reply(api, wanted.model, reply_id)
        if wanted.stream:
            return await self._stream(request, reply, wanted.include_usage, chunks)
        return await self._whole(reply, chunks)

    def _check_model(self, model: str) -> None:
        served = self._engine.model_card().name
        if model != served:
            raise _ModelNotFound(
                f"model {brief(model)} is not served here; this worker serves {served!r}"
            )

    async def _whole(self, reply: _Reply, chunks: AsyncGenerator[Chunk, None]) -> web.Response:
        texts: list[str] = []
        try:
            async with aclosing(chunks):
                async for chunk in chunks:
                    texts.append(chunk.text)
        except ShuttingDownError as exc:
            return error_response(503, str(exc), "engine_stopped")
        last = _final(chunk)
        self._metrics.served(last.usage)
        return json_response(reply.whole("".join(texts), last))

    async def _stream(
        self,
        request: web.Request,
        reply: _Reply,
        include_usage: bool,
        chunks: AsyncGenerator[Chunk, None],
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        try:
            async with aclosing(chunks):
                await self._pump(response, reply, include_usage, chunks)
            await _send(response, "[DONE]")
            await response.write_eof()
        except ConnectionResetError:
            # The client went away; leaving aclosing() above freed the engine's slot.
            log.debug("client disconnected from stream %s", reply.id)
        return response

    async def _pump(
        self,
        response: web.StreamResponse,
        reply: _Reply,
        include_usage: bool,
        chunks: AsyncGenerator[Chunk, None],
    ) -> None:
        for opening in reply.opening():
            await _send(response, opening)
        try:
            async for chunk in chunks:
                await _send(response, reply.delta(chunk, include_usage))
        except ShuttingDownError as exc:
            await _send(response, error_body(500, str(exc), "engine_stopped"))
            return
        last = _final(chunk)
        self._metrics.served(last.usage)
        if include_usage:
            await _send(response, reply.usage_chunk(last.usage))


def models_response(card: ModelCard) -> web.Response:
    """``GET /v1/models`` of a worker: the one model it serves."""
    entry = {
        "id": card.name,
        "object": "model",
        "created": 0,
        "owned_by": "dynamo",
        "max_model_len": card.context_length,
    }
    return json_response({"object": "list", "data": [entry]})


@dataclass(frozen=True)
class _Reply:
    """Builds the JSON bodies of one response."""

    api: OpenAIApi
    model: str
    id: str
    created: int = field(default_factory=lambda: int(time.time()))

    def _envelope(self, obj: str, choices: list[Json]) -> Json:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def whole(self, text: str, last: Chunk) -> Json:
        if self.api.kind == "chat":
            choice: Json = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text}
        choice |= {"logprobs": None, "finish_reason": last.finish_reason}
        return self._envelope(self.api.object_whole, [choice]) | {"usage": _usage(last.usage)}

    def opening(self) -> list[Json]:
        """Chunks sent before any token: the chat API announces the assistant's role."""
        if self.api.kind != "chat":
            return []
        delta = {"role": "assistant", "content": ""}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        return [self._envelope(self.api.object_chunk, [choice])]

    def delta(self, chunk: Chunk, include_usage: bool) -> Json:
        if self.api.kind == "chat":
            choice: Json = {"index": 0, "delta": {"content": chunk.text}}
        else:
            choice = {"index": 0, "text": chunk.text}
        choice |= {"logprobs": None, "finish_reason": chunk.finish_reason}
        body = self._envelope(self.api.object_chunk, [choice])
        return body | {"usage": None} if include_usage else body

    def usage_chunk(self, usage: Usage) -> Json:
        return self._envelope(self.api.object_chunk, []) | {"usage": _usage(usage)}


def _final(chunk: Chunk) -> Chunk:
    """The chunk a stream ended on, which the engine contract says carries the finish."""
    if chunk.finish_reason is None:
        raise RuntimeError("the engine ended a stream without a finish_reason")
    return chunk


def _usage(usage: Usage) -> Json:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


async def _send(response: web.StreamResponse, data: Json | str) -> None:
    await response.write(sse_event(data))


def _generate_request(
    request: web.Request, reply_id: str, prompt_ids: tuple[int, ...], wanted: Sampling
) -> GenerateRequest:
    """The engine's request, named by the caller's ``x-request-id`` or else the reply's id."""
    return GenerateRequest(
        request_id=request.headers.get("x-request-id") or reply_id,
        prompt_ids=prompt_ids,
        max_tokens=wanted.max_tokens,
        seed=wanted.seed,
        temperature=wanted.temperature,
        top_p=wanted.top_p,
        ignore_eos=wanted.ignore_eos,
    )
