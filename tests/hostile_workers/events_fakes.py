"""Hostile workers for the engine events boundary, as real processes.

``python -m tests.hostile_workers.events_fakes MODE --store URL`` registers a worker record
in the store (as ``dynamo-worker`` does: a lease kept alive, a system address, the engine
events offer) and serves ``GET /engine/events`` on that system address, misbehaving as
``MODE`` says:

* ``long_line``: the snapshot, then one 2 MiB line;
* ``malformed``: the snapshot, then one bad line, a different one on each connection (not
  JSON, not an object, wrong types, a non-finite usage, a huge count, deep nesting, a KV
  line with string token ids, a KV line out of sequence);
* ``spam``: the snapshot, then states as fast as the socket takes them;
* ``breaker``: the snapshot, then the end of the stream;
* ``kv_flood``: a worker offering KV events that stores new blocks as fast as it can,
  every line valid and under the line limit.

``GET /stats`` answers ``{"connections": N}``: how many times the stream was opened. It
prints ``hostile ready: id=... key=... system=URL`` once registered.

``python -m tests.hostile_workers.events_fakes upstream_inf`` is instead an upstream
OpenAI server for an ``--engine openai`` worker, whose ``/metrics`` says the KV cache is
``+Inf`` used; it prints ``upstream ready: http=URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Awaitable, Callable

from aiohttp import web

from dynamod.discovery.registration import Registration, new_instance_id
from dynamod.engine_events import RECORD_FIELD, EngineLoad, offer
from dynamod.records import ModelCard, RuntimeConfig, WorkerRecord
from dynamod.store import Store, open_store
from tests.support.web import served, until_signalled

LONG = 2 << 20
SNAPSHOT = {"seq": 0, "type": "snapshot", "state": EngineLoad().to_json()}
MALFORMED = [
    b"this is not JSON\n",
    b"[1, 2, 3]\n",
    b'{"type": "state", "state": {"running": "many"}}\n',
    b'{"type": "state", "state": {"kv_usage": Infinity}}\n',
    b'{"type": "state", "state": {"running": 99999999999}}\n',
    b'{"type": "state", "state": {"reason": "\\udc00"}}\n',
    b"[" * 5000 + b"]" * 5000 + b"\n",
    b'{"seq": 0, "type": "kv", "ts": 1.0, "events": [{"kind": "stored", "hashes": [1],'
    b' "parent": null, "tokens": ["a", "b"], "block_size": 2}]}\n',
    b'{"seq": 7, "type": "kv", "ts": 1.0, "events": [{"kind": "cleared"}]}\n',
]
FLOOD_BLOCKS = 200
"""Blocks in each stored line of the KV flood (some 20 KB a line)."""
BLOCK_SIZE = 16

Handler = Callable[[web.StreamResponse, int], Awaitable[None]]


def line(event: object) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


async def linger(response: web.StreamResponse) -> None:
    """Keep the stream open with heartbeats until the reader goes."""
    while True:
        await asyncio.sleep(1.0)
        await response.write(b'{"seq":0,"type":"heartbeat"}\n')


async def long_line(response: web.StreamResponse, n: int) -> None:
    await response.write(b'{"type":"state","state":{"reason":"' + b"x" * LONG + b'"}}\n')
    await linger(response)


async def malformed(response: web.StreamResponse, n: int) -> None:
    await response.write(MALFORMED[(n - 1) % len(MALFORMED)])
    await linger(response)


async def spam(response: web.StreamResponse, n: int) -> None:
    states = b"".join(
        line({"seq": i, "type": "state", "state": EngineLoad(running=i % 7).to_json()})
        for i in range(1000)
    )
    while True:
        await response.write(states)


async def kv_flood(response: web.StreamResponse, n: int) -> None:
    tokens = ",".join(str(t % 30_000) for t in range(FLOOD_BLOCKS * BLOCK_SIZE))
    await response.write(line({"seq": 0, "type": "kv", "ts": 1.0, "events": [{"kind": "cleared"}]}))
    seq, block = 1, n << 40
    while True:
        hashes = ",".join(map(str, range(block, block + FLOOD_BLOCKS)))
        block += FLOOD_BLOCKS
        await response.write(
            f'{{"seq":{seq},"type":"kv","ts":1.0,"events":[{{"kind":"stored","hashes":[{hashes}],'
            f'"parent":null,"tokens":[{tokens}],"block_size":{BLOCK_SIZE}}}]}}\n'.encode()
        )
        seq += 1


MODES: dict[str, Handler] = {
    "long_line": long_line,
    "malformed": malformed,
    "spam": spam,
    "kv_flood": kv_flood,
}


class Hostile:
    """The system server of one hostile worker."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.connections = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/engine/events", self.events)
        app.router.add_get("/stats", self.stats)
        return app

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"connections": self.connections})

    async def events(self, request: web.Request) -> web.StreamResponse:
        self.connections += 1
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        await response.write(line(SNAPSHOT))
        if self.mode == "breaker":
            await response.write_eof()  # and that is all: the stream ends after its snapshot
            return response
        with contextlib.suppress(ConnectionError):
            await MODES[self.mode](response, self.connections)
        return response


async def hostile(mode: str, store_url: str, model: str) -> None:
    async with served(Hostile(mode).app()) as system, await open_store(store_url) as store:
        await register_hostile(mode, store, model, system)


async def register_hostile(mode: str, store: Store, model: str, system: str) -> None:
    card = ModelCard(name=model)
    record = WorkerRecord(
        instance_id=new_instance_id(),
        namespace="dynamo",
        component="backend",
        endpoint="generate",
        address=system,  # no inference routes: only requests for its own model come
        model_card=card,
        runtime_config=RuntimeConfig(),
        system_address=system,
        host="hostile",
        pid=os.getpid(),
        version="hostile",
        extra={RECORD_FIELD: offer(kv=mode == "kv_flood")},
    )
    async with Registration(store, record, ttl=2):
        print(
            f"hostile ready: id={record.instance_id} key={record.key} system={system}", flush=True
        )
        await until_signalled()


async def upstream_inf(model: str) -> None:
    async def health(request: web.Request) -> web.Response:
        return web.json_response({})

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": model, "max_model_len": 512}]})

    async def metrics(request: web.Request) -> web.Response:
        text = (
            "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"
            "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc +Inf\n"
        )
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    async with served(app) as http:
        print(f"upstream ready: http={http}", flush=True)
        await until_signalled()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=[*MODES, "breaker", "upstream_inf"])
    parser.add_argument("--store", default="")
    parser.add_argument("--model", default="hostile")
    args = parser.parse_args()
    if args.mode == "upstream_inf":
        asyncio.run(upstream_inf(args.model))
    else:
        asyncio.run(hostile(args.mode, args.store, args.model))
    sys.exit(0)


if __name__ == "__main__":
    main()
