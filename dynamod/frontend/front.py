"""The OpenAI-compatible front: each request is routed to a worker and forwarded there.

Use::

    async with Frontend(router, view, tokenizers, registry=registry) as front:
        app = web.Application()
        front.add_to(app)
        runner = web.AppRunner(app, handler_cancellation=True)
        ...                                   # serve; at shutdown:
        front.begin_drain()                   # new requests get 503
        async with asyncio.timeout(grace):
            await front.wait_idle()           # in-flight requests finish
        # past the grace: front.cut_streams(why), and streams end with an error event

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` and ``GET /v1/models``
(every model with at least one worker in the view).

Per request: read the body (``prompts.reader``; ``prompts/body.py`` says what is checked:
the worker's own checks, model, ``nvext`` routing constraints and ``max_wait``) the way
most of the model's workers read it (``router.fit``: their tokenizer, block size and body
checks; a worker that disagrees is left out and reported, never decides for the others),
check that it fits the largest context among them, route it (prompt token count and KV
block hashes; only to a worker of that reading whose own context holds the prompt and its
output), forward the body to ``<worker.address>/v1/...``
(with the prompt's token ids added, so the worker need not tokenize again) and pass the
answer on (``relay.py``). The worker is held for
the whole request and released on completion, error or client disconnect;
``router.prefill_done`` is called at the first output event of a stream, or when a whole
response arrives.

Answers the front gives itself (OpenAI-shaped errors, ``replies.py``):

=======================================================  ======
malformed body, a field a worker would refuse, a         400
prompt (plus its output) over the largest context of
the model's workers, bad constraints, ``max_wait``
body over the application's ``client_max_size``          413
no worker serves the model (after a wait, when           404
``max_wait`` or the router's ``no_worker_wait`` asks)
... and its last worker left within ``gone_window`` s    503 + ``Retry-After``
a large body the prompt processes cannot take now          503 + ``Retry-After``
no worker satisfies the constraints (the router's        503
message names what was required and what exists),
queue wait over, router shutting down, front draining
pending queue full                                       429
worker unreachable / silent / 5xx before its first       one retry elsewhere, then
byte; its whole answer over ``limits.whole`` bytes or    502 / 504 / the worker's 5xx
cut off; its stream's first event over ``limits.event``  (naming the worker)
bytes, cut off or late
a whole answer being read when what all answers hold is  503 + ``Retry-After`` (naming
past the memory budget and it holds the most             the worker and the setting)
=======================================================  ======

Every worker failure is reported: one log line naming the worker, and
``dynamod_front_worker_failures_total{reason}``.

A client that disconnects cancels the upstream request: serve the application with
``handler_cancellation=True`` so that the handler is cancelled at once (without it, a
stream notices at its next write and a whole response runs to its end).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Self

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from dynamod.discovery.view import WorkerView
from dynamod.errors import PromptWorkerError, RoutingError
from dynamod.frontend.departures import Departures
from dynamod.frontend.front_metrics import CLIENT_CLOSED, FrontendMetrics
from dynamod.frontend.relay import (
    StreamRelay,
    UpstreamFailure,
    carries_output,
    relay_stream,
    relay_whole,
    send,
)
from dynamod.frontend.replies import FORWARDED_REQUEST_HEADERS, routing_error_response
from dynamod.http.inflight import Drains, RequestTracker
from dynamod.http.limits import AnswerLimits
from dynamod.http.memory import Claim, MemoryBudget
from dynamod.http.openai import (
    CHAT,
    COMPLETIONS,
    FieldError,
    ModelTemplateError,
    OpenAIApi,
    error_response,
)
from dynamod.http.sse import OpenStreams
from dynamod.prompts.body import CardLimits, ReadyRequest
from dynamod.prompts.reader import PromptReader, Read
from dynamod.records import ModelCard
from dynamod.router import Assignment, Router, RouteRequest
from dynamod.router.fit import ModelReading, Reading, forwards
from dynamod.tokenizers import SimpleTokenizer, Tokenizer
from dynamod.tokenizers.bundle import Tokenizers
from dynamod.traffic import Traffic

log = logging.getLogger(__name__)

WORKERS_TRIED = 2
"""A request is tried on at most this many workers (a first try and one retry)."""
DEFAULT_CLIENT_TIMEOUT = 300.0
DEFAULT_CONNECT_TIMEOUT = 5.0
_SHAPE_ONLY = SimpleTokenizer()
"""Reads the prompt of a request for a model no worker serves, only to check its shape."""
_UNSERVED = CardLimits(block_size=1, context_length=0, checked=False)
"""What the front knows of a model no worker serves: nothing to check a body against."""
RETRY_AFTER_SECONDS = 1
"""Seconds a client is told to wait (``Retry-After``) before retrying a retryable 503."""
GONE_WINDOW = 30.0
"""Seconds after a model's last worker left during which a request for it gets a
retryable 503 instead of 404 (the daemon's ``model_gone_window``)."""


class Frontend(Drains):
    """The OpenAI-compatible HTTP front; see the module docstring.

    ``client_timeout``: the longest a worker may stay silent (to answer, and between the
    events of a stream) before the front gives up on it. ``connect_timeout``: the longest
    a connection to a worker may take. ``limits``: the most a worker's answer may hold
    (a whole body; one event of a stream). ``reader`` reads bodies (``prompts.reader``: large
    ones in the daemon's prompt processes; all on the loop when None).
    ``tokenizers`` gives each model's workers' own tokenizer (the daemon's registry;
    ``Fixed`` in tests), or token counts and block hashes mean nothing. ``traffic`` counts
    each answer's first byte by worker (``dynamod/traffic.py``: the stats stream's rates
    and latencies, ``dynamoctl top``). The front owns
    one ``aiohttp.ClientSession``, opened by ``start()`` and closed by ``aclose()`` (or
    ``async with``).
    """

    def __init__(
        self,
        router: Router,
        view: WorkerView,
        tokenizers: Tokenizers,
        *,
        registry: CollectorRegistry | None = None,
        client_timeout: float = DEFAULT_CLIENT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        reader: PromptReader | None = None,
        gone_window: float = GONE_WINDOW,
        limits: AnswerLimits | None = None,
        traffic: Traffic | None = None,
        memory: MemoryBudget | None = None,
    ) -> None:
        self._router = router
        self._reader = reader if reader is not None else PromptReader(None)
        self._view = view
        self._metrics = FrontendMetrics(registry if registry is not None else CollectorRegistry())
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout, sock_read=client_timeout
        )
        self._tokenizers = tokenizers
        self._session: aiohttp.ClientSession | None = None
        self._requests = RequestTracker(self._metrics.in_flight)
        self._departures = Departures(gone_window)
        self._memory = memory if memory is not None else MemoryBudget()
        self._streams = OpenStreams(self._memory)
        self._relay = StreamRelay(limits or AnswerLimits(), self._streams, self._report)
        self._unfollow: Callable[[], None] | None = None
        self._traffic = traffic if traffic is not None else Traffic()

    async def start(self) -> None:
        """Open the session to the workers. Call once, before serving."""
        if self._session is not None:
            raise RuntimeError("Frontend.start() was already called")
        # No connection limit of its own: the router bounds what each worker gets.
        connector = aiohttp.TCPConnector(limit=0)
        # No decompression by aiohttp (a gzip bomb inflates on the loop): relay.py inflates
        # a whole answer in slices, and asks workers for identity.
        # No cookie jar: a worker's Set-Cookie is never kept by the front and sent with
        # other clients' requests, and there is nothing to look up per request.
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        self._departures.follow(self._view.records())
        self._unfollow = self._view.listen(self._departures.apply)

    async def aclose(self) -> None:
        """Close the session. Drain first: requests still in flight fail."""
        if self._unfollow is not None:
            self._unfollow()
            self._unfollow = None
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def cut_streams(self, message: str) -> int:
        """End every stream being relayed with an error event (``message``, code
        ``shutting_down``) and ``[DONE]``, as their handlers' next step; how many there were.
        For the end of a grace period: a client then knows its answer is incomplete."""
        return self._streams.cut(message)

    def add_to(self, app: web.Application) -> None:
        app.router.add_post(COMPLETIONS.path, self._completions)
        app.router.add_post(CHAT.path, self._chat)
        app.router.add_get("/v1/models", self._models)

    # -- routes

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, COMPLETIONS)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, CHAT)

    async def _models(self, request: web.Request) -> web.Response:
        readings = {model: self._router.reading(model) for model in self._router.table.models()}
        data = [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "dynamo",
                "max_model_len": chosen.context_length,
            }
            for name, chosen in sorted(readings.items())
            if chosen is not None
        ]
        return web.json_response({"object": "list", "data": data})

    async def _serve(self, request: web.Request, api: OpenAIApi) -> web.StreamResponse:
        if self._requests.draining:
            message = "the front is draining and takes no new requests"
            response: web.StreamResponse = error_response(503, message, "draining")
        else:
            try:
                with self._requests.request():
                    response = await self._answer(request, api)
            except asyncio.CancelledError:
                self._metrics.answered(api.route, CLIENT_CLOSED)
                raise
        self._metrics.answered(api.route, response.status)
        return response

    # -- one request

    async def _answer(self, request: web.Request, api: OpenAIApi) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            # Read in time and bounded before any handler: http/server.py.
            read = await self._reader.read_head(await request.read())
        except (FieldError, PromptWorkerError) as exc:
            return _refused(exc)
        chosen = self._router.reading(read.head.model)
        # A malformed prompt is a 400 even for a model nobody serves: check it first.
        routable = await self._read_prompt(read, api, chosen)
        if isinstance(routable, web.Response):
            return routable
        if chosen is None:
            return await self._unserved(request, api, read, started)
        return await self._forward(request, api, read, routable, chosen, started)

    async def _read_prompt(
        self, read: Read, api: OpenAIApi, chosen: ModelReading | None
    ) -> ReadyRequest | web.Response:
        """The body read the way the model's workers read it (only its shape for a model
        nobody serves), or the refusal to answer with."""
        tokenizer: Tokenizer = _SHAPE_ONLY
        model = _UNSERVED
        try:
            if chosen is not None:
                tokenizer, model = await self._tokenizers.for_card(chosen.card), _limits(chosen)
            return await self._reader.read_prompt(read, api, tokenizer, model)
        except (FieldError, PromptWorkerError) as exc:
            return _refused(exc)

    async def _unserved(
        self, request: web.Request, api: OpenAIApi, read: Read, started: float
    ) -> web.StreamResponse:
        """A request for a model no worker serves: it waits for one when its ``max_wait``
        or the router's ``no_worker_wait`` asks; else a retryable 503 when the model lost
        its last worker within ``gone_window`` seconds, else 404."""
        model = read.head.model
        wait = read.head.max_wait
        if (self._router.knobs.no_worker_wait if wait is None else wait) > 0:
            return await self._after_wait(request, api, read, started)
        gone = self._departures.gone_since(model)
        if gone is not None:
            message = (
                f"model {model!r} has no worker now: its last one left {gone:.1f} s ago; "
                f"retry shortly"
            )
            return error_response(
                503, message, "model_unavailable", retry_after=RETRY_AFTER_SECONDS
            )
        return error_response(404, self._router.unserved(model), "model_not_found", param="model")

    async def _after_wait(
        self, request: web.Request, api: OpenAIApi, read: Read, started: float
    ) -> web.StreamResponse:
        """Wait (in the router, up to the request's limit) until a worker of the model can
        take it, then read the body with that model's card and route it as usual. The
        worker that ended the wait is let go at once: the request is routed again with its
        prompt's blocks, so prefix reuse still counts."""
        head = read.head
        waiting = RouteRequest(head.model, head.constraints, max_wait=head.max_wait)
        try:
            async with self._router.route(waiting) as assignment:
                card = assignment.worker.model_card
        except RoutingError as exc:
            return routing_error_response(exc)
        chosen = self._router.reading(head.model) or _alone(card)
        routable = await self._read_prompt(read, api, chosen)
        if isinstance(routable, web.Response):
            return routable
        return await self._forward(request, api, read, routable, chosen, started)

    async def _forward(
        self,
        request: web.Request,
        api: OpenAIApi,
        read: Read,
        routable: ReadyRequest,
        chosen: ModelReading,
        started: float,
    ) -> web.StreamResponse:
        head = read.head
        route = RouteRequest(
            head.model,
            head.constraints,
            routable.prompt_tokens,
            routable.block_hashes,
            head.max_wait,
            needs=chosen.needs(routable.context_tokens),
        )
        headers = {h: request.headers[h] for h in FORWARDED_REQUEST_HEADERS if h in request.headers}
        return await self._dispatch(_Call(request, api, routable.raw, headers, started), route)

    async def _dispatch(self, call: _Call, route: RouteRequest) -> web.StreamResponse:
        """Route and forward; a failure before the worker's first byte is retried once on
        another eligible worker (the failed one excluded)."""
        failure: UpstreamFailure | None = None
        for attempt in range(1, WORKERS_TRIED + 1):
            with self._memory.claim("an answer") as claim:
                try:
                    async with self._router.route(route) as assignment:
                        outcome = await self._attempt(call, assignment, claim)
                except RoutingError as exc:
                    return failure.response(exc) if failure else routing_error_response(exc)
                if not isinstance(outcome, UpstreamFailure):
                    return await _written(call.request, outcome, claim)
            failure = outcome
            self._report(failure, retried=attempt < WORKERS_TRIED)
            if attempt < WORKERS_TRIED:
                self._metrics.retries.labels(reason=failure.reason).inc()
                route = replace(route, exclude={*route.exclude, failure.worker.key})
        assert failure is not None
        return failure.response()

    async def _attempt(
        self, call: _Call, assignment: Assignment, claim: Claim
    ) -> web.StreamResponse | UpstreamFailure:
        if self._session is None:
            raise RuntimeError("Frontend.start() must be called before serving requests")
        worker = assignment.worker
        upstream = await send(self._session, worker, call.api.path, call.body, call.headers)
        if isinstance(upstream, UpstreamFailure):
            return upstream
        async with upstream:
            if upstream.content_type == "text/event-stream":
                events = _FirstEvents(
                    lambda: self._first_byte(call, worker.key),
                    lambda: self._router.prefill_done(assignment),
                )
                return await relay_stream(call.request, upstream, worker, events.saw, self._relay)
            answer = await relay_whole(upstream, worker, self._relay.limits, claim)
            if not isinstance(answer, UpstreamFailure):
                self._first_byte(call, worker.key)
                self._router.prefill_done(assignment)
            return answer

    def _report(self, failure: UpstreamFailure, *, retried: bool = False) -> None:
        """One log line naming the worker, and the metric, for every failure of a worker."""
        self._metrics.worker_failures.labels(reason=failure.reason).inc()
        then = "; trying another worker" if retried else ""
        log.warning("%s%s", failure.message, then)

    def _first_byte(self, call: _Call, worker: str) -> None:
        elapsed = time.perf_counter() - call.started
        self._metrics.first_byte_after(call.api.route, elapsed)
        self._traffic.answered(worker, elapsed)


@dataclass(frozen=True)
class _Call:
    """One request on its way: what every attempt sends to a worker (``body``: the body as
    read, with the prompt's token ids added; the forwarded ``headers``), and what the
    answer is measured against."""

    request: web.Request
    api: OpenAIApi
    body: bytes
    headers: dict[str, str]
    started: float


class _FirstEvents:
    """Calls ``on_first`` at a stream's first event (its first byte) and ``on_output`` at
    its first output event (the worker's prefill is over)."""

    def __init__(self, on_first: Callable[[], None], on_output: Callable[[], None]) -> None:
        self._on_first = on_first
        self._on_output = on_output
        self._started = False
        self._prefilled = False

    def saw(self, event: bytes) -> None:
        if not self._started:
            self._started = True
            self._on_first()
        if not self._prefilled and carries_output(event):
            self._prefilled = True
            self._on_output()


async def _written(
    request: web.Request, answer: web.StreamResponse, claim: Claim
) -> web.StreamResponse:
    """A whole answer written to the client while its claim still holds its bytes (a
    client that does not read keeps them in its socket buffer; made to pay, its
    connection is aborted). A stream, or an answer that holds nothing, as it is."""
    if not claim.size or answer.prepared:
        return answer
    claim.stop = lambda _: _abort(request)
    with contextlib.suppress(ConnectionError):
        await answer.prepare(request)
        await answer.write_eof()
    return answer


def _abort(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()


def _limits(chosen: ModelReading) -> CardLimits:
    """What reading a body checks: the reading's block size and body checks, and the
    largest context of its workers (a request over it fits no worker: 400)."""
    block_size = chosen.reading.block_size
    return CardLimits(block_size, chosen.context_length, chosen.checked, chosen.card.name)


def _alone(card: ModelCard) -> ModelReading:
    """The reading of one worker's card, for a model whose workers all left meanwhile."""
    return ModelReading(Reading.of(card), card, (card.context_length,), 1, 0, not forwards(card))


def _refused(exc: FieldError | PromptWorkerError) -> web.Response:
    """The answer to a body that could not be read: a 4xx naming the field, or a retryable
    503 while the prompt processes cannot take it."""
    if isinstance(exc, FieldError):
        code = exc.openai_code if isinstance(exc, ModelTemplateError) else "invalid_value"
        return error_response(exc.status, str(exc), code, param=exc.param)
    return error_response(503, str(exc), "prompt_workers_busy", retry_after=RETRY_AFTER_SECONDS)
