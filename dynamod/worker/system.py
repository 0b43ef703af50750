"""The worker's system HTTP server, shared by every engine.

``POST /engine/update/model_taints`` with ``{"taints": [...]}`` replaces the caller-managed
taints of this worker's own record through the discovery update (``[]`` clears; topology
taints are kept) and answers ``{"status": "ok", "taints": [sorted caller taints]}``.

| case                                                     | status |
|----------------------------------------------------------|--------|
| body not JSON, not an object, no ``taints`` array of     | 400    |
| strings, an invalid or reserved taint                    |        |
| a token is configured and the bearer token is missing or | 401    |
| wrong                                                    |        |
| body over ``MAX_BODY`` bytes                             | 413    |
| the update lost every compare-and-swap race (retryable)  | 409    |
| starting, shutting down, or the store is unreachable     | 503    |

Errors are JSON ``{"error": <short title>, "message": <what was wrong>}``. Also
``GET /health`` (200 once registered, 503 otherwise), ``GET /metadata`` (the current
record) and ``GET /metrics`` (Prometheus).
"""

from __future__ import annotations

import logging
from typing import Literal

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from dynamod.auth import same_secret
from dynamod.discovery.records import Registration, update_taints
from dynamod.errors import (
    ConflictError,
    InvalidInputError,
    StoreUnavailableError,
    WorkerNotFoundError,
)
from dynamod.http.limits import load_json
from dynamod.taints import TaintUpdate, caller_taints

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024
State = Literal["starting", "running", "shutting down"]


def error(status: int, title: str, message: str) -> web.Response:
    return web.json_response({"error": title, "message": message}, status=status)


_TITLES = {408: "Request timeout", 413: "Payload too large"}


def refusal(status: int, message: str) -> web.Response:
    """A request refused before any handler (``http/server.py``), in this server's shape."""
    return error(status, _TITLES.get(status, "Bad request"), message)


class SystemServer:
    """The system routes of one worker; ``registration`` is set once it is registered."""

    def __init__(self, *, token: str | None, registry: CollectorRegistry) -> None:
        self.token = token
        self.registry = registry
        self.state: State = "starting"
        self.registration: Registration | None = None
        self._updates = Counter(
            "dynamo_worker_taint_updates",
            "Taint updates through the system route, by outcome.",
            ["outcome"],
            registry=registry,
        )

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post("/engine/update/model_taints", self._update_taints)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metadata", self._metadata)
        app.router.add_get("/metrics", self._metrics)
        return app

    def running(self, registration: Registration) -> None:
        self.registration = registration
        self.state = "running"

    def shutting_down(self) -> None:
        self.state = "shutting down"

    async def _update_taints(self, request: web.Request) -> web.Response:
        denied = self._check_token(request)
        if denied is not None:
            self._updates.labels("unauthorized").inc()
            return denied
        try:
            update = TaintUpdate.replace(_taints_of(await _json(request)))
        except InvalidInputError as exc:
            self._updates.labels("invalid").inc()
            return error(400, "Bad request", str(exc))
        if self.registration is None or self.state != "running":
            self._updates.labels("unavailable").inc()
            return error(
                503,
                "Unavailable",
                f"engine administrative routes are unavailable while the worker is {self.state}",
            )
        return await self._apply(self.registration, update)

    async def _apply(self, registration: Registration, update: TaintUpdate) -> web.Response:
        try:
            change = await update_taints(registration.store, registration.record.key, update)
        except ConflictError as exc:
            self._updates.labels("conflict").inc()
            return error(409, "Conflict", str(exc))
        except (StoreUnavailableError, WorkerNotFoundError) as exc:
            self._updates.labels("unavailable").inc()
            return error(503, "Unavailable", str(exc))
        self._updates.labels("ok").inc()
        log.info("taints of %s set to %s", registration.record.instance_id, change.after)
        return web.json_response({"status": "ok", "taints": list(caller_taints(change.after))})

    def _check_token(self, request: web.Request) -> web.Response | None:
        if self.token is None:
            return None
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and same_secret(given.strip(), self.token):
            return None
        message = "a bearer token is required" if not given else "the bearer token is not valid"
        response = error(401, "Unauthorized", message)
        response.headers["WWW-Authenticate"] = 'Bearer realm="dynamo-worker"'
        return response

    async def _health(self, request: web.Request) -> web.Response:
        registration = self.registration
        body = {
            "status": "ready" if self.state == "running" else self.state,
            "instance_id": registration.record.instance_id if registration else None,
        }
        return web.json_response(body, status=200 if self.state == "running" else 503)

    async def _metadata(self, request: web.Request) -> web.Response:
        if self.registration is None:
            return error(503, "Unavailable", "the worker is not registered yet")
        registration = self.registration
        body = {"record": registration.record.to_json(), "revision": registration.revision}
        return web.json_response(body)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )


async def _json(request: web.Request) -> object:
    return load_json(await request.read() or b"{}", "request body")


def _taints_of(body: object) -> list[str]:
    if not isinstance(body, dict):
        raise InvalidInputError("request body must be a JSON object")
    taints = body.get("taints")
    if not isinstance(taints, list) or not all(isinstance(t, str) for t in taints):
        raise InvalidInputError("'taints' must be a JSON array of strings")
    return taints
