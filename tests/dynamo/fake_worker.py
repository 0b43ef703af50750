"""A stand-in for a Dynamo 1.6.1 worker, as far as discovery and its taint route go, for
tests that need no Dynamo: its card and endpoint record in etcd on a lease of its own, and
``POST /engine/update/model_taints`` doing what Dynamo's route does (``dynamo.common.
model_taints`` calling ``update_model_taints``), word for word where it answers: refuse a
body that is not an object, taints that are not strings, the reserved prefix (500,
"Python callback failed: ValueError: ..."); then, under one lock, re-read the stored card,
replace its caller taints (sorted, the generated ones kept) and write it back on its lease
only when they changed; answer 200 ``{"status":"ok","taints":[...]}`` as ``text/plain``.

``mode`` makes it misbehave as real workers can: ``"stock"`` has no route (404, as the
stock mocker), ``"starting"`` answers 200 ``{"status":"error"}``, ``"silent"`` answers ok
without storing anything. The real thing is in ``test_real_fleet.py``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Literal

from aiohttp import web

from dynamod.store import KEEP, Lease, Store
from dynamod.taints import TOPOLOGY_PREFIX
from tests.dynamo import values

Mode = Literal["dynamo", "stock", "starting", "silent"]
ROUTE = "/engine/update/model_taints"


class FakeDynamoWorker:
    def __init__(
        self,
        etcd: Store,
        number: int,
        *,
        taints: tuple[str, ...] = (),
        zone: str | None = None,
        mode: Mode = "dynamo",
    ) -> None:
        self.etcd, self.number, self.mode = etcd, number, mode
        self.taints, self.zone = taints, zone
        self.requests = 0
        self.lease: Lease | None = None
        self._lock = asyncio.Lock()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def id(self) -> str:
        return f"{self.number:x}"

    async def start(self) -> FakeDynamoWorker:
        app = web.Application()
        app.router.add_route("*", ROUTE, self._route)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.lease = await self.etcd.grant(30)
        system = f"127.0.0.1:{self.port}"
        card = values.card(self.number, taints=self.taints or None, zone=self.zone, system=system)
        await self.etcd.put(values.card_key(self.number), card, lease=self.lease)
        instance = values.instance(self.number)
        await self.etcd.put(values.instance_key(self.number), instance, lease=self.lease)
        return self

    async def stop(self) -> None:
        if self.lease is not None:
            await self.etcd.revoke(self.lease)  # a graceful stop: everything goes
        await self.close_port()

    async def close_port(self) -> None:
        """Close its system port and every connection to it, and leave its keys: what a
        SIGKILL does to a worker whose lease has not ended yet."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def stored_taints(self) -> list[str]:
        entry = await self.etcd.get(values.card_key(self.number))
        assert entry is not None
        return values.caller_taints_of(entry.value)

    async def _route(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self.mode == "stock":
            message = f"Route {ROUTE} not found"
            return _answer(404, {"error": "Route not found", "message": message})
        if self.mode == "starting":
            message = "engine administrative routes are unavailable while the worker is starting"
            return _answer(200, {"status": "error", "message": message})
        try:
            body = json.loads(await request.read() or b"{}")
        except json.JSONDecodeError as exc:
            return _answer(400, {"error": "Invalid JSON", "message": str(exc)})
        refused = _refusal(body)
        if refused:
            message = f"Python callback failed: ValueError: {refused}"
            return _answer(500, {"error": "Handler error", "message": message})
        taints = sorted(set(body["taints"]))
        if self.mode == "dynamo":
            async with self._lock:
                await self._store(taints)
        return _answer(200, {"status": "ok", "taints": taints})

    async def _store(self, taints: list[str]) -> None:
        key = values.card_key(self.number)
        entry = await self.etcd.get(key)
        assert entry is not None
        card = json.loads(entry.value)
        runtime = card["card_json"]["runtime_config"]
        generated = [t for t in runtime.get("taints", []) if t.startswith(TOPOLOGY_PREFIX)]
        wanted = sorted({*taints, *generated})
        if runtime.get("taints") != wanted:
            runtime["taints"] = wanted
            await self.etcd.put(key, json.dumps(card).encode(), lease=KEEP)


def _refusal(body: object) -> str:
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    taints = body.get("taints")
    if not isinstance(taints, list) or not all(isinstance(t, str) for t in taints):
        return "'taints' must be a JSON array of strings"
    for taint in taints:
        if taint.startswith(TOPOLOGY_PREFIX):
            return f"taint '{taint}' uses reserved prefix '{TOPOLOGY_PREFIX}'"
    return ""


def _answer(status: int, body: dict[str, object]) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type="text/plain")
