"""The front's added latency: a small completion sent to a worker directly, and through
the front to the same worker.

    python -m bench.front                     # 500 requests each way after 50 warm-up
    python -m bench.front --requests 2000 --json out.json

One ``dynamo-worker`` (mocker engine, ``--speedup-ratio 1000``: a one-token answer costs
the engine microseconds) registers in a file store. In this process a ``WorkerView`` feeds
a ``Router`` and a ``Frontend`` served on loopback, as the daemon wires them. An
``aiohttp`` client with keep-alive sends the same non-streaming completion (one output
token, same prompt, same worker) either straight to the worker (the floor) or to the
front, in alternating blocks of 25 so background load hits both alike. Requests are
sequential: each latency is one client round trip, the front's part being reading the
body, tokenizing, routing, one more loopback hop (kept alive) and relaying the answer.
``overhead`` is the front's p50 minus the direct p50.

Each event loop the servers may run on is measured in turn (``--loops``; the default, both:
``uvloop``, the servers' default, and ``asyncio``, the standard one), the front and the
worker on the same loop (``DYNAMO_EVENT_LOOP``, ``dynamod.lifecycle.server_loop``), and
``--rounds`` times over, alternating, so that background load hits each loop alike.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from bench.common import (
    Stats,
    header,
    interruptible,
    ms,
    overhead,
    owned,
    places,
    render_table,
    stats_json,
    write_json,
)
from dynamod.discovery.view import WorkerView
from dynamod.frontend import Frontend
from dynamod.http.openai import WORKER_ID_HEADER
from dynamod.lifecycle import LOOP_ENV, LOOPS, server_loop
from dynamod.router import Router, RouterKnobs
from dynamod.store import Store, open_store
from dynamod.tokenizers import SimpleTokenizer
from dynamod.tokenizers.bundle import Fixed
from tests.support.processes import Proc, running, worker

WARMUP = 50
BLOCK = 25
MODEL = "bench"
BODY = {
    "model": MODEL,
    "prompt": "the quiet river runs north under the old stone bridge",
    "max_tokens": 1,
    "seed": 1,
}
HEADERS = ("path", "n", "p50 ms", "p99 ms", "min ms", "overhead")


@contextlib.asynccontextmanager
async def front_on_loopback(store: Store) -> AsyncIterator[tuple[str, WorkerView]]:
    """View → router → front, served on a free loopback port; yields its URL and the view."""
    router = Router(RouterKnobs(), registry=CollectorRegistry())
    view = WorkerView(store)
    view.listen(router.apply)
    async with (
        owned(view.run(), "worker view"),
        Frontend(router, view, Fixed(SimpleTokenizer())) as front,
        serve_front(front) as url,
    ):
        yield url, view


@contextlib.asynccontextmanager
async def serve_front(front: Frontend) -> AsyncIterator[str]:
    """``front`` served on a free loopback port, as the daemon serves it; yields its URL."""
    app = web.Application()
    front.add_to(app)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def one(http: aiohttp.ClientSession, url: str, expect_worker: str) -> int:
    """One completion; its latency in ns. A wrong answer stops the benchmark."""
    started = time.perf_counter_ns()
    async with http.post(url, json=BODY) as response:
        await response.read()
    elapsed = time.perf_counter_ns() - started
    if response.status != 200 or response.headers.get(WORKER_ID_HEADER) != expect_worker:
        raise RuntimeError(f"{url} answered {response.status} from the wrong worker or failed")
    return elapsed


@contextlib.asynccontextmanager
async def worker_and_front(url: str) -> AsyncIterator[tuple[Proc, str, aiohttp.ClientSession]]:
    """A mocker worker in the store ``url``, a front that sees it, and a client session."""
    store = await open_store(url)
    try:
        async with (
            running(worker(url, "--speedup-ratio", "1000", model=MODEL)) as proc,
            front_on_loopback(store) as (front_url, view),
            aiohttp.ClientSession() as http,
        ):
            key = proc.field("key")
            await view.wait_for(lambda v: v.get(key) is not None)
            yield proc, front_url, http
    finally:
        await store.aclose()


async def measure(url: str, n: int) -> dict[str, Stats]:
    async with worker_and_front(url) as (proc, front_url, http):
        return await compare(http, proc, front_url, n)


async def compare(
    http: aiohttp.ClientSession, proc: Proc, front_url: str, n: int
) -> dict[str, Stats]:
    targets = {
        "direct": proc.field("http") + "/v1/completions",
        "front": front_url + "/v1/completions",
    }
    samples: dict[str, list[int]] = {name: [] for name in targets}
    worker_id = proc.field("id")
    for url in targets.values():
        for _ in range(WARMUP):
            await one(http, url, worker_id)
    while len(samples["front"]) < n:
        for name, url in targets.items():
            block = min(BLOCK, n - len(samples[name]))
            samples[name] += [await one(http, url, worker_id) for _ in range(block)]
    return {name: Stats.of(values) for name, values in samples.items()}


def measure_on(loop: str, url: str, n: int) -> dict[str, Stats]:
    """``measure`` with the front, and the worker it starts, on the event loop ``loop``."""
    os.environ[LOOP_ENV] = loop
    running_loop = server_loop()
    try:
        return running_loop.run_until_complete(measure(url, n))
    finally:
        running_loop.close()


def rows(loop: str, stats: dict[str, Stats]) -> list[list[str]]:
    direct = stats["direct"]
    out = []
    for name, s in stats.items():
        extra = "floor" if name == "direct" else overhead(s, direct)
        out.append([f"{name} ({loop})", str(s.n), ms(s.p50_ms), ms(s.p99_ms), ms(s.min_ms), extra])
    return out


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.front", description=__doc__)
    parser.add_argument("--requests", type=int, default=500, help="samples each way")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument(
        "--loops",
        default=",".join(LOOPS),
        help=f"event loops to measure, comma-separated (of {', '.join(LOOPS)})",
    )
    parser.add_argument("--rounds", type=int, default=1, help="measurements of each loop")
    args = parser.parse_args(argv)
    if args.requests < 1:
        parser.error(f"--requests {args.requests} must be at least 1")
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds} must be at least 1")
    args.loops = args.loops.split(",")
    if not args.loops or not set(args.loops) <= set(LOOPS):
        parser.error(f"--loops {','.join(args.loops)}: each must be one of {', '.join(LOOPS)}")
    return args


def run(args: argparse.Namespace) -> int:
    found = {"python": platform.python_version(), "aiohttp": aiohttp.__version__}
    detail = (
        f"{args.requests} non-streaming one-token completions each way after {WARMUP} "
        "warm-up, sequential, keep-alive, one mocker worker"
    )
    print(header("front latency", found, detail))
    runs: list[tuple[str, dict[str, Stats]]] = []
    with places(["file"]) as where:
        for _ in range(args.rounds):
            runs.extend((loop, measure_on(loop, where.urls["file"], args.requests))
                        for loop in args.loops)  # fmt: skip
    print(render_table(HEADERS, [row for loop, stats in runs for row in rows(loop, stats)]))
    document: dict[str, Any] = {
        "benchmark": "front",
        "versions": found,
        "requests": args.requests,
        "warmup": WARMUP,
        "runs": [
            {
                "loop": loop,
                "rows": {name: stats_json(s) for name, s in stats.items()},
                "overhead_p50_ms": stats["front"].p50_ms - stats["direct"].p50_ms,
                "overhead_p99_ms": stats["front"].p99_ms - stats["direct"].p99_ms,
            }
            for loop, stats in runs
        ],
    }
    write_json(args.json, document)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return interruptible(lambda: run(parse(argv)))


if __name__ == "__main__":
    sys.exit(main())
