"""One attempt at a worker: send the request, then relay its answer to the client.

The line that matters is the moment the client's answer starts. Before it, nothing has
reached the client, and a failure is an ``UpstreamFailure`` that may be tried once more
on another worker: a refused or reset connection, a timeout, a 5xx status, and also an
answer the front cannot pass on: a whole body over ``AnswerLimits.whole`` bytes or cut
off, or a 2xx whole body that is empty or not a JSON object (the client could read no
answer in it), a stream whose first event is over ``AnswerLimits.event`` bytes, cut off
or late.
So the client's answer starts with the worker's whole body, or with a stream's first
whole event (its status line and headers then go out with it).

After it, the answer is the client's: a stream is passed on event by event (each read
whole and bounded: ``http.sse``), and a failure (an event over its limit, a cut, a
silence, an end without ``[DONE]``) ends it with one error event and ``[DONE]``, the
shape the worker itself uses. Only complete events are written, so a stream cut off
mid-event never hands the client half a JSON object. Every failure of a worker, before
or after that line, is reported (``report``: a log line naming the worker, a metric).
aiohttp errors are translated here and nowhere else in the front. Workers are asked for
``identity``; a compressed whole answer is inflated in slices within the same limit
(``http.bounded.inflate``), a compressed stream refused (aiohttp inflates nothing).

The streams being relayed are held in ``http.sse.OpenStreams``, whose ``cut(message)`` the
daemon calls when its grace period ends with streams still open: each ends with an error
event (code ``shutting_down``) and ``[DONE]``, so that no client sees a silent cut (a
stream cut before its first event is answered 503, code ``shutting_down``).

What an answer holds (a whole one from its first byte until the caller has written it, a
stream's event being written and its client's socket buffer) is a claim on the daemon's
memory budget (``http.memory``): a whole answer made to pay while it is read is a 503
naming the worker and the budget (the worker did nothing wrong: no failure reported, no
retry), a stream made to pay has its client aborted.
"""

from __future__ import annotations

import functools
import io
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from yarl import URL

from dynamod import jsoncodec
from dynamod.errors import InvalidInputError, MemoryBudgetError, OversizeError
from dynamod.frontend.replies import passed_headers
from dynamod.http.bounded import EncodingError, inflate, read_body
from dynamod.http.failures import described
from dynamod.http.limits import AnswerLimits
from dynamod.http.memory import Claim
from dynamod.http.openai import error_event, error_response
from dynamod.http.sse import DONE_EVENT, EventReader, OpenStream, OpenStreams, is_done
from dynamod.records import WorkerRecord

log = logging.getLogger(__name__)

ERROR_TEXT_LIMIT = 64 * 1024
"""Bytes of a worker's 5xx answer read for its message; the rest is not read."""
_READ_FAILURES = (aiohttp.ClientError, HttpProcessingError, TimeoutError)
_SENT_HEADERS = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
"""An honest worker answers uncompressed; a compressed whole answer is inflated in slices
(``http.bounded.inflate``), never by aiohttp on the loop (the session does not decompress)."""


@dataclass(frozen=True)
class UpstreamFailure:
    """A worker that failed, and how to tell the client.

    ``reason`` is the metric label: ``unreachable``, ``timeout``, ``status`` (a 5xx),
    ``oversize`` (an answer or an event over the front's limits) or ``broken`` (an answer
    cut off, or not in the shape it announced). ``status`` is what the client gets if no
    other worker answers: 502 for an unreachable, oversize or broken worker, 504 for a
    silent one, the worker's own status for a 5xx.
    """

    worker: WorkerRecord
    reason: str
    status: int
    message: str

    def response(self, retry_error: Exception | None = None) -> web.Response:
        """The client's answer; ``retry_error`` says why no other worker was tried."""
        message = self.message
        if retry_error is not None:
            message = f"{message}; no other worker could take the request: {retry_error}"
        code = "worker_timeout" if self.reason == "timeout" else "worker_failed"
        return error_response(self.status, message, code, worker_id=self.worker.instance_id)


FailureReport = Callable[[UpstreamFailure], None]
"""Told of every failure of a worker (the front logs and counts it)."""


async def send(
    session: aiohttp.ClientSession,
    worker: WorkerRecord,
    path: str,
    body: bytes,
    headers: Mapping[str, str],
) -> aiohttp.ClientResponse | UpstreamFailure:
    """POST ``body`` to ``worker``'s ``path``; its response once the status line is in, or
    why not.

    The caller owns a returned response and must release it (``async with``).
    """
    url = worker.address.rstrip("/") + path
    try:
        upstream = await session.post(
            _parsed(url), data=_payload(body), headers={**headers, **_SENT_HEADERS}
        )
    except TimeoutError as exc:  # aiohttp's connect and read timeouts are TimeoutErrors too
        said = f"{_at(worker, url)} did not answer: {_timeout(session.timeout, exc)}"
        return UpstreamFailure(worker, "timeout", 504, said)
    except aiohttp.ClientError as exc:
        said = f"{_at(worker, url)} is unreachable: {described(exc)}"
        return UpstreamFailure(worker, "unreachable", 502, said)
    if upstream.status < 500:
        return upstream
    async with upstream:
        said = await _error_text(upstream)
    said = f"{_at(worker, url)} answered {upstream.status}: {said}"
    return UpstreamFailure(worker, "status", upstream.status, said)


@functools.lru_cache(maxsize=4096)
def _parsed(url: str) -> URL:
    """A worker's route parsed once per worker and route rather than at every request; one
    that does not parse is aiohttp's ``InvalidURL``, as it would have raised."""
    try:
        return URL(url)
    except (ValueError, TypeError) as exc:
        raise aiohttp.InvalidURL(url) from exc


def _at(worker: WorkerRecord, url: str) -> str:
    return f"worker {worker.instance_id} at {url}"


_AT_ONCE = 1024 * 1024
"""aiohttp warns (``ResourceWarning``) when a body over 1 MiB is given as bytes: it is
written to the socket in one call. A larger one is given as a stream, written in chunks."""


def _payload(raw: bytes) -> bytes | io.BytesIO:
    return raw if len(raw) <= _AT_ONCE else io.BytesIO(raw)


async def _error_text(upstream: aiohttp.ClientResponse) -> str:
    """The message of a worker's error answer, or as much of its body as makes sense."""
    try:
        raw = await read_body(upstream, ERROR_TEXT_LIMIT, "its error answer")
    except OversizeError as exc:
        return f"({exc})"
    except _READ_FAILURES as exc:
        return f"(its body could not be read: {described(exc)})"
    try:
        message = jsoncodec.read(raw, "its error answer")["error"]["message"]  # type: ignore[index]
    except (InvalidInputError, KeyError, TypeError):
        return raw[:200].decode(errors="replace") or "(empty body)"
    return str(message)[:ERROR_TEXT_LIMIT]


def _timeout(limits: aiohttp.ClientTimeout, exc: TimeoutError) -> str:
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return f"connecting took longer than {limits.sock_connect:g} s"
    return f"it was silent for {limits.sock_read:g} s"


def _name(worker: WorkerRecord) -> str:
    return f"worker {worker.instance_id}"


async def relay_whole(
    upstream: aiohttp.ClientResponse, worker: WorkerRecord, limits: AnswerLimits, claim: Claim
) -> web.Response | UpstreamFailure:
    """The worker's whole answer, passed on; a failure when it is over ``limits.whole``
    bytes or breaks off (nothing has reached the client yet). Its bytes are held on
    ``claim`` (the daemon's memory budget), which the caller keeps until the answer is
    written; a claim made to pay is a 503 naming the worker and the budget."""
    name = _name(worker)
    what = f"the answer of {name}"
    claim.name = what
    try:
        raw = await read_body(upstream, limits.whole, what, claim)
        encoding = upstream.headers.get("Content-Encoding", "")
        body = await inflate(raw, encoding, limits.whole, what, claim)
        claim.resize(2 * len(body))  # until written: the body, and its copy the client's
        # socket buffer holds while the client does not read
    except MemoryBudgetError as exc:
        return error_response(503, str(exc), "memory_budget", worker_id=worker.instance_id,
                              retry_after=1)  # fmt: skip
    except OversizeError as exc:
        return UpstreamFailure(worker, "oversize", 502, f"{name} sent too large an answer: {exc}")
    except EncodingError as exc:
        return UpstreamFailure(worker, "broken", 502, f"{name} sent an answer unread: {exc}")
    except _READ_FAILURES as exc:
        said = f"{name} failed while sending its answer: {described(exc)}"
        return UpstreamFailure(worker, _reason(exc), _status(exc), said)
    if 200 <= upstream.status < 300:
        wrong = _not_an_answer(body)
        if wrong:
            said = f"{name} answered {upstream.status} with {wrong}"
            return UpstreamFailure(worker, "broken", 502, said)
    headers = passed_headers(upstream.headers, worker.instance_id)
    return web.Response(status=upstream.status, body=body, headers=headers)


def _not_an_answer(body: bytes) -> str:
    """Why a 2xx whole body is no answer (empty, or not a JSON object); ``""`` when it is
    one. The client would get nothing it could read: a failure of the worker instead."""
    if not body.strip():
        return "an empty body"
    try:
        value = jsoncodec.read(body, "its answer")
    except InvalidInputError as exc:
        return f"a body that is not JSON ({exc}; it begins {body[:60]!r})"
    if not isinstance(value, dict):
        return f"a body that is not a JSON object (it begins {body[:60]!r})"
    return ""


@dataclass(frozen=True)
class StreamRelay:
    """What relaying one stream needs besides the stream: the limits, the open streams
    (for ``cut``), and where failures are reported."""

    limits: AnswerLimits
    streams: OpenStreams
    report: FailureReport


async def relay_stream(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    worker: WorkerRecord,
    on_event: Callable[[bytes], None],
    relay: StreamRelay,
) -> web.StreamResponse | UpstreamFailure:
    """Pass the worker's event stream on, calling ``on_event`` before each event is sent.

    The client's answer starts with the first whole event; a failure before it is
    returned (the caller may try another worker). A client that goes away is noticed at
    the next write; the caller's releasing the upstream response then closes the worker's
    connection, which stops its generation.
    """
    what = f"the stream of {_name(worker)}"
    encoding = upstream.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding != "identity":  # asked for identity (``send``); events are read as sent
        said = f"{_name(worker)} sent an event stream in Content-Encoding {encoding[:40]!r}"
        return UpstreamFailure(worker, "broken", 502, f"{said}; the front reads them uncompressed")
    events = EventReader(upstream.content, relay.limits.event, what)
    with relay.streams.opened(upstream, f"the stream of {_name(worker)}") as stream:
        first = await _next(events, stream, worker)
        if isinstance(first, UpstreamFailure):
            if stream.cut is not None:
                return error_response(503, stream.cut, "shutting_down")
            return first
        response = web.StreamResponse(
            status=upstream.status, headers=passed_headers(upstream.headers, worker.instance_id)
        )
        try:
            await response.prepare(request)
            stream.client = request.transport
            await _pump(response, first, events, stream, worker, on_event, relay)
            await response.write_eof()
        except ConnectionError:  # reset, or lost while a write waited (aborted: memory.py)
            log.debug("client went away from a stream of worker %s", worker.instance_id)
    return response


async def _next(
    events: EventReader, stream: OpenStream, worker: WorkerRecord
) -> bytes | UpstreamFailure:
    """The stream's next whole event, or why there is none (its end included)."""
    name = _name(worker)
    try:
        event = await events.next_event()
    except OversizeError as exc:
        return UpstreamFailure(worker, "oversize", 502, f"{name} sent too large an event: {exc}")
    except _READ_FAILURES as exc:
        said = f"{name} failed mid-stream: {described(exc)}"
        return UpstreamFailure(worker, _reason(exc), _status(exc), said)
    if event is not None and stream.cut is None:
        return event
    dropped = f" ({events.partial} bytes of a last event dropped)" if events.partial else ""
    return UpstreamFailure(
        worker, "broken", 502, f"{name} ended the stream without [DONE]{dropped}"
    )


async def _pump(
    response: web.StreamResponse,
    event: bytes,
    events: EventReader,
    stream: OpenStream,
    worker: WorkerRecord,
    on_event: Callable[[bytes], None],
    relay: StreamRelay,
) -> None:
    while True:
        on_event(event)
        if not relay.streams.make_room(stream, len(event)):
            return  # the memory budget made it pay: its client was aborted, and told why
        await response.write(event)
        if not stream.holding(0):
            return
        if is_done(event):
            return
        found = await _next(events, stream, worker)
        if isinstance(found, UpstreamFailure):
            await _end_broken(response, stream, found, relay.report)
            return
        event = found


async def _end_broken(
    response: web.StreamResponse,
    stream: OpenStream,
    failure: UpstreamFailure,
    report: FailureReport,
) -> None:
    if stream.cut is not None:  # the daemon cut it: the worker did nothing wrong
        await response.write(error_event(stream.cut, "shutting_down"))
    else:
        report(failure)
        await response.write(error_event(failure.message, "worker_failed"))
    await response.write(DONE_EVENT)


def _reason(exc: BaseException) -> str:
    return "timeout" if isinstance(exc, TimeoutError) else "broken"


def _status(exc: BaseException) -> int:
    return 504 if isinstance(exc, TimeoutError) else 502


def carries_output(event: bytes) -> bool:
    """Whether an SSE event holds generated output: any event but the chat API's opening
    announcement of the assistant's role, which the worker sends before any token."""
    try:
        payload = jsoncodec.read(event.removeprefix(b"data:"), "an event")
    except InvalidInputError:  # [DONE], or not JSON: either way the stream is past its start
        return True
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or not choices:
        return True
    return not all(_announces_role(choice) for choice in choices)


def _announces_role(choice: object) -> bool:
    delta = choice.get("delta") if isinstance(choice, dict) else None
    return isinstance(delta, dict) and "role" in delta and not delta.get("content")
