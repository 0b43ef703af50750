"""One attempt at a worker: send the request, then relay its answer to the client.

The line that matters is the worker's *first byte* (its response status and headers):

* before it, a failure (refused or reset connection, a timeout, a 5xx status) is a
  ``UpstreamFailure``: nothing has reached the client, so the request may be tried once more on
  another worker;
* after it, the answer is the client's: a whole response is passed on as it is; a stream
  of server-sent events is passed on event by event, and a failure ends it with one error
  event and ``[DONE]``, the shape the worker itself uses.

Only complete events (``data: ...`` up to the blank line) are written, so a stream cut
off mid-event never hands the client half a JSON object. aiohttp errors are translated
here and nowhere else in the front.

``Streams`` holds the streams being relayed; ``cut(message)`` ends each of them with an
error event (code ``shutting_down``) and ``[DONE]``: the daemon calls it when its grace
period ends with streams still open, so that no client sees a silent cut. It closes each
stream's upstream connection, which wakes its pending read; the stream's own task writes
the ending, so nothing writes to a response from outside the task serving it.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from dynamod.frontend.inbound import Inbound
from dynamod.frontend.replies import DONE_EVENT, passed_headers
from dynamod.http.openai import error_event, error_response
from dynamod.records import WorkerRecord

log = logging.getLogger(__name__)

EVENT_END = b"\n\n"
MAX_EVENT = 16 * 1024 * 1024
"""The largest SSE event relayed; a longer one ends the stream as broken."""


@dataclass(frozen=True)
class UpstreamFailure:
    """A worker that failed before its first byte, and how to tell the client.

    ``reason`` is the metric label: ``unreachable``, ``timeout`` or ``status`` (a 5xx).
    ``status`` is what the client gets if no other worker answers: 502 for an unreachable
    worker, 504 for a silent one, the worker's own status for a 5xx.
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


async def send(
    session: aiohttp.ClientSession,
    worker: WorkerRecord,
    inbound: Inbound,
    headers: Mapping[str, str],
) -> aiohttp.ClientResponse | UpstreamFailure:
    """POST ``inbound`` to ``worker``; its response once the status line is in, or why not.

    The caller owns a returned response and must release it (``async with``).
    """
    url = worker.address.rstrip("/") + inbound.api.path
    name = f"worker {worker.instance_id} at {url}"
    try:
        upstream = await session.post(
            url, data=_payload(inbound.raw), headers={**headers, "Content-Type": "application/json"}
        )
    except TimeoutError as exc:  # aiohttp's connect and read timeouts are TimeoutErrors too
        said = f"{name} did not answer: {_timeout(session.timeout, exc)}"
        return UpstreamFailure(worker, "timeout", 504, said)
    except aiohttp.ClientError as exc:
        return UpstreamFailure(worker, "unreachable", 502, f"{name} is unreachable: {_why(exc)}")
    if upstream.status < 500:
        return upstream
    async with upstream:
        said = await _error_text(upstream)
    return UpstreamFailure(
        worker, "status", upstream.status, f"{name} answered {upstream.status}: {said}"
    )


_AT_ONCE = 1024 * 1024
"""aiohttp warns (``ResourceWarning``) when a body over 1 MiB is given as bytes: it is
written to the socket in one call. A larger one is given as a stream, written in chunks."""


def _payload(raw: bytes) -> bytes | io.BytesIO:
    return raw if len(raw) <= _AT_ONCE else io.BytesIO(raw)


async def _error_text(upstream: aiohttp.ClientResponse) -> str:
    """The message of a worker's error answer, or as much of its body as makes sense."""
    try:
        raw = await upstream.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        return f"(its body could not be read: {_why(exc)})"
    try:
        message = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return raw[:200].decode(errors="replace") or "(empty body)"
    return str(message)


def _timeout(limits: aiohttp.ClientTimeout, exc: TimeoutError) -> str:
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return f"connecting took longer than {limits.sock_connect:g} s"
    return f"it was silent for {limits.sock_read:g} s"


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


async def relay_whole(upstream: aiohttp.ClientResponse, worker: WorkerRecord) -> web.Response:
    """The worker's whole answer, passed on (502 if its body breaks off)."""
    try:
        body = await upstream.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        message = f"worker {worker.instance_id} failed while sending its answer: {_why(exc)}"
        return error_response(502, message, "worker_failed", worker_id=worker.instance_id)
    headers = passed_headers(upstream.headers, worker.instance_id)
    return web.Response(status=upstream.status, body=body, headers=headers)


@dataclass(eq=False)
class _Open:
    upstream: aiohttp.ClientResponse
    cut: str | None = None
    """Why the stream was cut, once it was."""


@dataclass
class Streams:
    """The streams being relayed; see the module docstring."""

    _open: set[_Open] = field(default_factory=set)

    @contextlib.contextmanager
    def opened(self, upstream: aiohttp.ClientResponse) -> Iterator[_Open]:
        stream = _Open(upstream)
        self._open.add(stream)
        try:
            yield stream
        finally:
            self._open.discard(stream)

    def cut(self, message: str) -> int:
        """End every open stream with an error event and ``[DONE]``; how many there were."""
        for stream in self._open:
            stream.cut = message
            stream.upstream.close()
        return len(self._open)


async def relay_stream(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    worker: WorkerRecord,
    on_event: Callable[[bytes], None],
    streams: Streams,
) -> web.StreamResponse:
    """Pass the worker's event stream on, calling ``on_event`` before each event is sent.

    A client that goes away is noticed at the next write; the caller's releasing the
    upstream response then closes the worker's connection, which stops its generation.
    """
    response = web.StreamResponse(
        status=upstream.status, headers=passed_headers(upstream.headers, worker.instance_id)
    )
    try:
        await response.prepare(request)
        with streams.opened(upstream) as stream:
            await _pump(response, stream, worker, on_event)
        await response.write_eof()
    except ConnectionResetError:
        log.debug("client went away from a stream of worker %s", worker.instance_id)
    return response


async def _pump(
    response: web.StreamResponse,
    stream: _Open,
    worker: WorkerRecord,
    on_event: Callable[[bytes], None],
) -> None:
    upstream = stream.upstream
    while True:
        try:
            event = await upstream.content.readuntil(EVENT_END, max_size=MAX_EVENT)
        except (aiohttp.ClientError, HttpProcessingError, TimeoutError) as exc:
            broke = f"worker {worker.instance_id} failed mid-stream: {_why(exc)}"
            await _end_broken(response, stream, broke)
            return
        if stream.cut is not None or not event.endswith(EVENT_END):
            # The end of the body, maybe after half an event.
            broke = f"worker {worker.instance_id} ended the stream without [DONE]"
            await _end_broken(response, stream, broke)
            return
        on_event(event)
        await response.write(event)
        if event == DONE_EVENT:
            return


async def _end_broken(response: web.StreamResponse, stream: _Open, message: str) -> None:
    if stream.cut is not None:  # the daemon cut it: the worker did nothing wrong
        await response.write(error_event(stream.cut, "shutting_down"))
    else:
        log.warning("%s", message)
        await response.write(error_event(message, "worker_failed"))
    await response.write(DONE_EVENT)


def carries_output(event: bytes) -> bool:
    """Whether an SSE event holds generated output: any event but the chat API's opening
    announcement of the assistant's role, which the worker sends before any token."""
    try:
        payload = json.loads(event.removeprefix(b"data:"))
    except ValueError:  # [DONE], or not JSON: either way the stream is past its start
        return True
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or not choices:
        return True
    return not all(_announces_role(choice) for choice in choices)


def _announces_role(choice: object) -> bool:
    delta = choice.get("delta") if isinstance(choice, dict) else None
    return isinstance(delta, dict) and "role" in delta and not delta.get("content")
