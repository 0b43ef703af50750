"""Many workers' engine events streams from one small server: a fleet's streams without a
fleet of processes.

    python -m bench.stream_server [--port 0] [--upstream http://127.0.0.1:PORT]

Every path ``/<name>/engine/events`` is one worker's stream, as a worker serves it
(``worker/publish.py``, the wire format of ``dynamod.engine_events``): a snapshot line (an
idle engine's load), then a heartbeat every ``--heartbeat`` seconds. Worker records cloned
from one real worker, each with ``system_address`` ``http://HOST:PORT/<name>``, make a
daemon follow one stream per record, all served here (``bench.scale``, the fleet tests).
Any other path under ``/<name>/`` is relayed to ``--upstream`` (the real worker's system
address: its tokenizer bundle, for one), so a clone answers like the worker it copies.

``GET /stats``: ``{"open": streams open now, "opened": streams opened in all,
"least": the fewest heartbeats any open stream has sent}``: a test waits on these rather
than on time. ``POST /partition?every=N``: every ``N``-th stream (``/w<i>`` with ``i % N ==
0``) goes silent, as behind a partition: open connections send nothing more, new ones get
no answer; ``POST /heal`` ends it. It prints ``stream server ready: http=URL`` once it
listens, raises its own soft limit on open files to the hard one, and runs until SIGTERM or
SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import AsyncIterator, Sequence

import aiohttp
from aiohttp import web

from dynamod import jsoncodec
from dynamod.engine_events import HEARTBEAT, EngineLoad
from dynamod.open_files import raise_limit

SNAPSHOT_STATE = EngineLoad(kv_blocks_total=16384, source="engine")
"""What each stream reports: a mocker worker's idle engine."""


class StreamServer:
    """The streams and their counts; see the module docstring."""

    def __init__(self, heartbeat: float, upstream: str) -> None:
        self.heartbeat = heartbeat
        self.upstream = upstream.rstrip("/")
        self.opened = 0
        self.beats: dict[int, int] = {}
        """Heartbeats sent, by open stream."""
        self._http: aiohttp.ClientSession | None = None
        self.every = 0
        """Streams cut off by a partition: every ``every``-th (0: none)."""
        self.healed = asyncio.Event()
        self.healed.set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/stats", self.stats)
        app.router.add_post("/partition", self.partition)
        app.router.add_post("/heal", self.heal)
        app.router.add_get("/{name}/engine/events", self.events)
        app.router.add_get("/{name}/{tail:.*}", self.relay)
        app.cleanup_ctx.append(self._session)
        return app

    async def _session(self, app: web.Application) -> AsyncIterator[None]:
        async with aiohttp.ClientSession() as self._http:
            yield

    async def stats(self, request: web.Request) -> web.Response:
        least = min(self.beats.values(), default=0)
        return web.json_response({"open": len(self.beats), "opened": self.opened, "least": least})

    async def partition(self, request: web.Request) -> web.Response:
        self.every = int(request.query.get("every", "2"))
        self.healed.clear()
        return web.json_response({"every": self.every})

    async def heal(self, request: web.Request) -> web.Response:
        self.every = 0
        self.healed.set()
        return web.json_response({"every": 0})

    async def _reachable(self, name: str) -> None:
        """Wait while ``name`` is behind the partition."""
        index = name.removeprefix("w")
        while self.every and index.isdigit() and int(index) % self.every == 0:
            await self.healed.wait()

    async def events(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        await self._reachable(name)
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        try:
            await response.prepare(request)
        except ConnectionResetError:  # the client gave up while this server was stopped
            return response
        stream = self.opened
        self.opened += 1
        self.beats[stream] = 0
        try:
            snapshot = {"seq": 0, "type": "snapshot", "state": SNAPSHOT_STATE.to_json()}
            await response.write(jsoncodec.write(snapshot) + b"\n")
            beat = jsoncodec.write({"seq": 0, "type": "heartbeat"}) + b"\n"
            while True:
                await asyncio.sleep(self.heartbeat)
                await self._reachable(name)
                await response.write(beat)
                self.beats[stream] += 1
        except ConnectionResetError:
            return response
        finally:
            del self.beats[stream]

    async def relay(self, request: web.Request) -> web.Response:
        if not self.upstream or self._http is None:
            raise web.HTTPNotFound(text="this stream server relays nothing (no --upstream)")
        url = f"{self.upstream}/{request.match_info['tail']}"
        async with self._http.get(url) as answer:
            body = await answer.read()
            return web.Response(body=body, status=answer.status, content_type=answer.content_type)


async def serve(port: int, heartbeat: float, upstream: str) -> None:
    runner = web.AppRunner(StreamServer(heartbeat, upstream).app(), handle_signals=False)
    await runner.setup()
    try:
        # A fleet connects at once: a backlog that takes it (the kernel caps it at somaxconn).
        site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096)
        await site.start()
        host, bound = runner.addresses[0][:2]
        print(f"stream server ready: http=http://{host}:{bound}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--heartbeat", type=float, default=HEARTBEAT)
    parser.add_argument("--upstream", default="", help="the real worker's system address")
    args = parser.parse_args(argv)
    raise_limit()
    asyncio.run(serve(args.port, args.heartbeat, args.upstream))
    return 0


if __name__ == "__main__":
    sys.exit(main())
