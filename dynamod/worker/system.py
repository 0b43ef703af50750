"""The worker's system HTTP server, shared by every engine.

``POST /engine/update/model_taints`` with ``{"taints": [...]}`` replaces the caller-managed
taints of this worker's own record through the discovery update (``[]`` clears; topology
taints are kept) and answers ``{"status": "ok", "taints": [sorted caller taints]}``, as
Dynamo's route does. Updates are made by the worker's one ``WorkerTaintWriter`` (one at a time,
each audited; ``writer.py``).

| case                                                          | status |
|---------------------------------------------------------------|--------|
| the update was made (or changed nothing)                      | 200    |
| body not JSON, not an object, no ``taints`` array of strings, | 400    |
| a taint refused by the grammar, the reserved prefix or as a   |        |
| look-alike of the cordon; more than one ``Authorization``     |        |
| header                                                        |        |
| a token is configured and the bearer token is missing or      | 401    |
| wrong                                                         |        |
| the token is read-only, or may not change those taints        | 403    |
| body over ``MAX_BODY`` bytes                                  | 413    |
| every compare-and-swap attempt lost to writers in other       | 409    |
| processes (retryable; the body says how many attempts)        |        |
| starting, shutting down, or the store / record is unavailable | 503    |

Errors are JSON ``{"error": <short title>, "message": <what was wrong>}``; a 409 adds
``"retryable": true`` and ``"attempts"``. Also ``GET /health`` (200 once registered, 503
otherwise), ``GET /metadata`` (the current record) and ``GET /metrics`` (Prometheus).
"""

from __future__ import annotations

import logging

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from dynamod import jsoncodec
from dynamod.auth import Principal, Tokens
from dynamod.errors import (
    AccessError,
    ConflictError,
    DynamoError,
    InvalidInputError,
    ShuttingDownError,
    StoreUnavailableError,
    UnauthenticatedError,
    WorkerNotFoundError,
)
from dynamod.taints import TaintUpdate, caller_taints
from dynamod.worker.writer import WorkerTaintWriter

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024


def error(status: int, title: str, message: str, **extra: object) -> web.Response:
    return web.json_response({"error": title, "message": message, **extra}, status=status)


_TITLES = {408: "Request timeout", 413: "Payload too large"}


def refusal(status: int, message: str) -> web.Response:
    """A request refused before any handler (``http/server.py``), in this server's shape."""
    return error(status, _TITLES.get(status, "Bad request"), message)


def _access_refused(exc: AccessError) -> web.Response:
    """401 (with the challenge) for a missing or unknown token, 403 for a read-only one."""
    if not isinstance(exc, UnauthenticatedError):
        return error(403, "Forbidden", str(exc))
    response = error(401, "Unauthorized", str(exc))
    response.headers["WWW-Authenticate"] = 'Bearer realm="dynamo-worker"'
    return response


class SystemServer:
    """The system routes of one worker; its taint updates go through ``writer``."""

    def __init__(
        self, *, tokens: Tokens | None, registry: CollectorRegistry, writer: WorkerTaintWriter
    ) -> None:
        self.tokens = tokens
        self.registry = registry
        self.writer = writer
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

    async def _update_taints(self, request: web.Request) -> web.Response:
        peer = _peer(request)
        caller: Principal | None = None
        try:
            caller = self._caller(request)
            if caller is not None:
                caller.require_write()
        except AccessError as exc:
            return self._denied(exc, peer, caller)
        except InvalidInputError as exc:  # ambiguous credentials
            self._updates.labels("invalid").inc()
            self.writer.refused(None, peer=peer, caller=None, error=exc)
            return error(400, "Bad request", str(exc))
        try:
            update = TaintUpdate.replace(_taints_of(await _json(request)))
        except InvalidInputError as exc:  # a refused attempt: audited too
            self._updates.labels("invalid").inc()
            self.writer.refused(None, peer=peer, caller=caller, error=exc)
            return error(400, "Bad request", str(exc))
        return await self._apply(update, peer, caller)

    async def _apply(
        self, update: TaintUpdate, peer: str, caller: Principal | None
    ) -> web.Response:
        try:
            change = await self.writer.apply(update, peer=peer, caller=caller)
        except AccessError as exc:
            self._updates.labels("forbidden").inc()
            return error(403, "Forbidden", str(exc))
        except ConflictError as exc:
            self._updates.labels("conflict").inc()
            return error(409, "Conflict", str(exc), retryable=True, attempts=exc.attempts)
        except InvalidInputError as exc:  # a limit: permanent, nothing written
            self._updates.labels("invalid").inc()
            return error(400, "Bad request", str(exc))
        except (ShuttingDownError, StoreUnavailableError, WorkerNotFoundError) as exc:
            self._updates.labels("unavailable").inc()
            return error(503, "Unavailable", str(exc))
        except DynamoError as exc:  # the store refused the write: said, not a traceback
            self._updates.labels("failed").inc()
            log.warning("taint update failed: %s", exc)
            return error(500, "Internal server error", str(exc))
        self._updates.labels("ok").inc()
        log.info("taints of %s set to %s", change.worker, list(change.after))
        return web.json_response({"status": "ok", "taints": list(caller_taints(change.after))})

    def _denied(self, exc: AccessError, peer: str, caller: Principal | None) -> web.Response:
        """401 for a missing or unknown token, 403 for a read-only one; audited."""
        unknown = isinstance(exc, UnauthenticatedError)
        self._updates.labels("unauthorized" if unknown else "forbidden").inc()
        self.writer.refused(None, peer=peer, caller=caller, error=exc)
        return _access_refused(exc)

    def check_write(self, request: web.Request) -> web.Response | None:
        """None when ``request`` may change the worker (no tokens configured, or a token
        that may write); else its 401 / 403 answer. For the engine's admin routes
        (``POST /engine/reset_prefix_cache``), which change no taints."""
        try:
            caller = self._caller(request)
            if caller is not None:
                caller.require_write()
        except AccessError as exc:
            return _access_refused(exc)
        except InvalidInputError as exc:
            return error(400, "Bad request", str(exc))
        return None

    def _caller(self, request: web.Request) -> Principal | None:
        """Who presented which token: None when no token is configured, else the token's
        holder (``UnauthenticatedError`` when there is none or nobody issued it). More
        than one ``Authorization`` header is refused (``InvalidInputError``) whether or not
        a token is configured: which one counts would depend on who reads them."""
        presented = request.headers.getall("Authorization", [])
        if len(presented) > 1:
            raise InvalidInputError(
                f"{len(presented)} Authorization headers were sent; send exactly one bearer token"
            )
        if self.tokens is None:
            return None
        scheme, _, given = (presented[0] if presented else "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise UnauthenticatedError("a bearer token is required")
        return self.tokens.authenticate(given.strip())

    async def _health(self, request: web.Request) -> web.Response:
        writer = self.writer
        registration = writer.registration
        body = {
            "status": "ready" if writer.state == "running" else writer.state,
            "instance_id": registration.record.instance_id if registration else None,
        }
        return web.json_response(body, status=200 if writer.state == "running" else 503)

    async def _metadata(self, request: web.Request) -> web.Response:
        registration = self.writer.registration
        if registration is None:
            return error(503, "Unavailable", "the worker is not registered yet")
        body = {"record": registration.record.to_json(), "revision": registration.revision}
        return web.json_response(body)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )


def _peer(request: web.Request) -> str:
    """``host:port`` of the client (``host`` alone when the transport does not say)."""
    peername = request.transport.get_extra_info("peername") if request.transport else None
    if isinstance(peername, tuple) and len(peername) >= 2:
        host, port = peername[0], peername[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return request.remote or "unknown"


async def _json(request: web.Request) -> object:
    return jsoncodec.read(await request.read() or b"{}", "request body")


def _taints_of(body: object) -> list[str]:
    if not isinstance(body, dict):
        raise InvalidInputError("request body must be a JSON object")
    taints = body.get("taints")
    if not isinstance(taints, list) or not all(isinstance(t, str) for t in taints):
        raise InvalidInputError("'taints' must be a JSON array of strings")
    return taints
