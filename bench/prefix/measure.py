"""``bench/prefix/run.py``'s two measures beside the workload: how late a KV event becomes
visible in a router's index, and how much memory the index and a worker's mirror take.

**Lag** (``lag``): one real mocker worker process; in this process the daemon's own parts
(``WorkerView``, ``EngineStreams``, ``KvIndexer`` into a ``KvIndex``) follow its events stream, as a
daemon does. Requests go straight to the worker; for every KV line after the first
snapshot, lag = this process's wall clock once the index applied it minus the worker's wall
clock when its engine published it (one machine, one clock). The floor, in the same run:
a timestamped line written by another process over a loopback HTTP stream and read here
(the transport's own share).

**Memory** (``memory``): ``tracemalloc`` around building an index of 1,048,576 blocks (16
tokens each, in chains of 64 as prompts are): blocks held by one worker each, then by two
workers each (a shared prefix); and a worker's mirror (``KvPublisher``) of as many.
"""

from __future__ import annotations

import asyncio
import gc
import random
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import Stats, owned
from dynamod.boundary import EngineStreams, KvIndexer
from dynamod.discovery.view import WorkerView
from dynamod.kv_events import BlockStored, KvBatch
from dynamod.router.kvindex import KvIndex
from dynamod.store import open_store
from dynamod.worker.engines.kvevents import KvPublisher
from tests.support.processes import running, worker
from tests.support.servers import free_port

BLOCK = 16
MILLION = 1 << 20


class Timed(KvIndexer):
    """A ``KvIndexer`` that keeps every batch's lag once the load has begun."""

    def __init__(self, index: KvIndex) -> None:
        from prometheus_client import CollectorRegistry

        super().__init__(index, MILLION, CollectorRegistry())
        self.lags_ns: list[int] = []
        self.recording = False

    def batch(self, key: str, batch: KvBatch) -> None:
        super().batch(key, batch)
        if self.recording:
            self.lags_ns.append(int((time.time() - batch.ts) * 1e9))


async def lag(requests: int = 400) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-kv-lag-") as tmp:
        store_url = (Path(tmp) / "store").as_uri()
        args = ("--block-size", str(BLOCK), "--num-kv-blocks", "512", "--speedup-ratio", "1000")
        async with running(worker(store_url, *args, model="lag")) as proc:
            store = await open_store(store_url)
            index = KvIndex()
            feed = Timed(index)
            view = WorkerView(store)
            feeds = EngineStreams(view, lambda key, load: None, kv=feed)
            try:
                async with owned(view.run(), "view"), owned(feeds.run(), "feeds"):
                    await _until(lambda: index.workers == 1)
                    feed.recording = True
                    await _load(proc.field("http"), requests)
                    await _until(lambda: len(feed.lags_ns) >= requests)
            finally:
                await store.aclose()
        floor = await _floor(requests)
    found = Stats.of(feed.lags_ns)
    return {"n": found.n, "p50_ms": found.p50_ms, "p99_ms": found.p99_ms, "max_ms": found.max_ms,
            "floor_p50_ms": floor.p50_ms, "floor_p99_ms": floor.p99_ms}  # fmt: skip


async def _until(check: Any, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError("the lag benchmark's worker did not get there in time")
        await asyncio.sleep(0.05)


async def _load(url: str, requests: int) -> None:
    """Distinct 64-token prompts, one at a time (each stores 4 blocks; the cache of 512
    blocks evicts after a while, so removals flow too)."""
    rng = random.Random(5)
    async with aiohttp.ClientSession() as http:
        for _ in range(requests):
            words = " ".join(rng.choice(("the", "of", "and", "to", "in", "a")) for _ in range(64))
            body = {"model": "lag", "prompt": words, "max_tokens": 1}
            async with http.post(f"{url}/v1/completions", json=body) as response:
                await response.read()


FLOOR_SERVER = """
import sys, time, asyncio
from aiohttp import web
async def lines(request):
    r = web.StreamResponse(); await r.prepare(request)
    for _ in range(int(sys.argv[2])):
        await r.write(f"{time.time()!r}\\n".encode()); await asyncio.sleep(0.005)
    return r
app = web.Application(); app.router.add_get("/", lines)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=lambda *a: print("up", flush=True))
"""


async def _floor(lines: int) -> Stats:
    port = free_port()
    argv = [sys.executable, "-c", FLOOR_SERVER, str(port), str(lines)]
    server = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
    try:
        assert server.stdout is not None and (await server.stdout.readline()).strip() == b"up"
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/") as r:
            samples = [int((time.time() - float(line)) * 1e9) async for line in r.content]
        return Stats.of(samples)
    finally:
        server.terminate()
        await server.wait()


def memory() -> dict[str, Any]:
    """Bytes per (worker, block) entry of the index, each block held by one worker and
    each by two; bytes per block of a worker's mirror. 1,048,576 entries each time."""
    one = _measured(lambda: _index(shared=False))
    two = _measured(lambda: _index(shared=True))
    mirror = _measured(_filled_mirror)
    return {
        "index_bytes_per_block": round(one / MILLION),
        "index_mib_per_1m_blocks": round(one / (1 << 20)),
        "index_bytes_per_block_held_by_two": round(two / MILLION),
        "mirror_bytes_per_block": round(mirror / MILLION),
        "mirror_mib_per_1m_blocks": round(mirror / (1 << 20)),
    }


def _chains(count: int, salt: int) -> Iterator[BlockStored]:
    """Stored events of ``count`` blocks in all: 64-block prompts of random tokens."""
    rng = random.Random(salt)
    for start in range(0, count, 64):
        blocks = min(64, count - start)
        tokens = tuple(rng.randrange(32_000) for _ in range(blocks * BLOCK))
        yield BlockStored(tuple(rng.getrandbits(64) for _ in range(blocks)), None, tokens, BLOCK)


def _index(*, shared: bool) -> KvIndex:
    """8 workers of 131,072 blocks; ``shared``: workers 2k and 2k+1 hold the same ones."""
    index = KvIndex()
    per = MILLION // 8
    for w in range(8):
        index.attach(f"worker-{w}", per)
        for event in _chains(per, salt=w // 2 if shared else w):
            index.apply(f"worker-{w}", [event])
    return index


def _filled_mirror() -> object:
    mirror = KvPublisher()
    for event in _chains(MILLION, salt=7):
        mirror.publish([event], ts=0.0)
    return mirror


def _measured(build: Any) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = build()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del kept
    return after - before
