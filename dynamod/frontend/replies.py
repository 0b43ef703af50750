"""What the front answers with itself: routing errors in OpenAI's shape
(``http/openai.py``, the worker's shape too), and the worker's response headers as they are
passed on. Every answer given after a worker was chosen carries ``x-dynamo-worker-id``; one
given before any choice does not.
"""

from __future__ import annotations

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from dynamod.errors import (
    NoEligibleWorkerError,
    QueueFullError,
    QueueTimeoutError,
    RoutingError,
    ShuttingDownError,
)
from dynamod.http.openai import WORKER_ID_HEADER, error_response

# Hop-by-hop headers, and the ones aiohttp writes for the body it sends (the front may
# re-frame it: chunked here where the worker sent a length, or the reverse).
_NOT_PASSED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "content-encoding",
        "date",
        "server",
    }
)

# Request headers worth carrying to the worker: the request id names the engine request.
FORWARDED_REQUEST_HEADERS = ("x-request-id", "traceparent", "tracestate")

# Each routing error, its status and code. Order matters only for subclasses; none here.
_ROUTING: tuple[tuple[type[RoutingError], int, str], ...] = (
    (NoEligibleWorkerError, 503, "no_eligible_worker"),
    (QueueTimeoutError, 503, "queue_timeout"),
    (QueueFullError, 429, "queue_full"),
    (ShuttingDownError, 503, "shutting_down"),
)


def routing_error_response(exc: RoutingError) -> web.Response:
    """The answer for a request the router refused: 503, or 429 for a full queue."""
    for kind, status, code in _ROUTING:
        if isinstance(exc, kind):
            return error_response(status, str(exc), code)
    return error_response(503, str(exc), "routing_failed")


def passed_headers(upstream: CIMultiDictProxy[str], worker_id: str) -> CIMultiDict[str]:
    """The worker's response headers the front passes on, tagged with the worker id."""
    headers = CIMultiDict((k, v) for k, v in upstream.items() if k.lower() not in _NOT_PASSED)
    headers[WORKER_ID_HEADER] = worker_id
    return headers
