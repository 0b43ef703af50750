"""The honest front's latency and the daemon's memory while one hostile worker is attached,
beside the same with none: what a broken or hostile worker costs everyone else.

    python -m bench.hostile                         # ~3 min on 2 cores
    python -m bench.hostile --requests 200 --json out.json
    python -m bench.hostile --only caller           # the kinds whose name holds "caller"

A real ``dynamod`` on a file store with two honest mocker workers (model ``llama``). Each
round attaches one hostile process (the fakes of ``tests/hostile_workers/``, real
processes registered in the same store) and measures, while it misbehaves, ``--requests``
sequential small completions of the honest model through the front (p50 / p99), the
daemon's RSS (its peak, sampled every 0.1 s) and ``/health``'s p99. Kinds:

* engine events: a 2 MiB line, malformed lines, state spam at full speed, a stream cut
  after every snapshot, a KV flood (four workers storing blocks as fast as they can);
* a worker of the honest model whose card says ``context_length: 2``;
* a worker that answers a never-ending body, with a trickle of requests sent to it;
* chat templates that are a CPU bomb and a memory bomb, with a trickle of requests sent
  to them (one at a time, back to back);
* and a hostile API caller (``tests/hostile/unread_streams.py``, on the daemon's unix
  socket, so one caller): 1,000 ``TailEvents`` or 1,000 ``WaitDrained`` streams it never
  reads, held open while the honest requests run (issue 28: each takes a stream slot, so
  all but ``max_streams_per_caller`` are refused).

Each kind runs in turn between two baselines (none attached), so a drift of the machine
shows. The verdict column says how the hostile worker was reported (its mark in the
listing, or the answer its requests got).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import re
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from bench.common import (
    Stats,
    header,
    interruptible,
    render_table,
    stats_json,
    versions,
    write_result,
)
from dynamod.http.openai import WORKER_ID_HEADER
from tests.support.processes import Proc, daemon, dynamoctl, env, running, worker

MODEL = "llama"
BODY = {"model": MODEL, "prompt": "the quiet river runs north", "max_tokens": 1}
HOSTILE_ENV = {
    # As the hostile-worker tests run it: a KV bound a flood reaches, budgets low enough
    # that two busy cores notice, small template bounds.
    "DYNAMO_KV_BLOCKS_TOTAL": "20000",
    "DYNAMO_WORKER_EVENT_BYTES_PER_SECOND": str(256 << 10),
    "DYNAMO_WORKER_EVENT_BYTES_BURST": str(4 << 20),
    "DYNAMO_TEMPLATE_CPU_SECONDS": "1",
    "DYNAMO_PROMPT_PROCESS_MEMORY_MB": "1024",
}


@dataclass(frozen=True)
class Kind:
    """One hostile process: how to start it (from the store's URL and the daemon's gRPC
    endpoint), and the requests that keep it misbehaving."""

    name: str
    argv: Callable[[str, str], list[str]]
    ready: str
    copies: int = 1
    trickle: dict[str, Any] | None = None
    """A body sent to it back to back while the honest requests are measured."""


def _events(mode: str) -> Callable[[str, str], list[str]]:
    return lambda store, _: [
        sys.executable,
        "-m",
        "tests.hostile_workers.events_fakes",
        mode,
        "--store",
        store,
    ]


def _front(*args: str) -> Callable[[str, str], list[str]]:
    return lambda store, _: [
        sys.executable,
        "-m",
        "tests.hostile_workers.front_fakes",
        "worker",
        "--store",
        store,
        *args,
    ]


def _chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def _templates(store: str, _: str) -> list[str]:
    return [sys.executable, "-m", "tests.hostile_workers.template_fakes", store]


CALLER_STREAMS = 1000


def _caller(kind: str) -> Callable[[str, str], list[str]]:
    return lambda _, endpoint: [
        sys.executable,
        "-m",
        "tests.hostile.unread_streams",
        endpoint,
        "",  # the unix socket: no token
        str(CALLER_STREAMS),
        kind,
    ]


KINDS = (
    Kind("events: a 2 MiB line", _events("long_line"), r"^hostile ready:"),
    Kind("events: malformed lines", _events("malformed"), r"^hostile ready:"),
    Kind("events: state spam", _events("spam"), r"^hostile ready:"),
    Kind("events: cut after each snapshot", _events("breaker"), r"^hostile ready:"),
    Kind("events: KV flood (4 workers)", _events("kv_flood"), r"^hostile ready:", copies=4),
    Kind(
        "card: context_length 2",
        _front("--context", "2", "--id", "c" * 16),
        r"^front-fake worker ready:",
    ),
    Kind(
        "answer: a body that never ends",
        _front("--mode", "huge", "--taint", "huge"),
        r"^front-fake worker ready:",
        trickle={**BODY, "nvext": {"routing_constraints": {"required_taints": ["huge"]}}},
    ),
    Kind("template: CPU bomb", _templates, r"^template fakes ready:", trickle=_chat("tpl-cpu")),
    Kind(
        "template: memory bomb",
        _templates,
        r"^template fakes ready:",
        trickle=_chat("tpl-doubling"),
    ),
    Kind("caller: 1,000 unread TailEvents", _caller("tail"), r'^\{"open"'),
    Kind("caller: 1,000 WaitDrained", _caller("wait-drained"), r'^\{"open"'),
)


@dataclass
class Sample:
    """One round: the honest requests' latencies, the daemon's peak RSS, /health's."""

    kind: str
    front: Stats
    health: Stats
    peak_rss_mb: float
    verdict: str


async def measure(
    http: aiohttp.ClientSession, front: str, requests: int, served: list[str] | None = None
) -> list[int]:
    """``requests`` honest completions, one after the other: their latencies; the worker
    that served each goes to ``served``."""
    samples = []
    for _ in range(requests):
        started = time.perf_counter_ns()
        async with http.post(f"{front}/v1/completions", json=BODY) as answer:
            await answer.read()
            assert answer.status == 200, f"an honest request got {answer.status}"
        samples.append(time.perf_counter_ns() - started)
        if served is not None:
            served.append(answer.headers.get(WORKER_ID_HEADER, ""))
    return samples


async def sample_daemon(
    http: aiohttp.ClientSession, front: str, pid: int, stop: asyncio.Event
) -> tuple[float, list[int]]:
    """The daemon's peak RSS (MB) and /health's latencies, every 0.1 s until ``stop``."""
    peak, health = 0.0, []
    process = psutil.Process(pid)
    while not stop.is_set():
        peak = max(peak, process.memory_info().rss / 2**20)
        started = time.perf_counter_ns()
        async with http.get(f"{front}/health") as answer:
            await answer.read()
        health.append(time.perf_counter_ns() - started)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)
    return peak, health


async def trickle(
    http: aiohttp.ClientSession, front: str, body: dict[str, Any], statuses: list[int]
) -> None:
    """Send ``body`` back to back until cancelled, keeping the statuses it got (0: none)."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    timeout = aiohttp.ClientTimeout(total=60)
    while True:
        try:
            async with http.post(front + path, json=body, timeout=timeout) as answer:
                await answer.read()
                statuses.append(answer.status)
        except (aiohttp.ClientError, TimeoutError):
            statuses.append(0)


async def round_(
    http: aiohttp.ClientSession, d: Proc, requests: int, kind: Kind | None, store: str
) -> Sample:
    front = d.field("http")
    async with contextlib.AsyncExitStack() as stack:
        hostile: list[Proc] = []
        if kind is not None:
            for _ in range(kind.copies):
                proc = Proc(kind.argv(store, d.field("grpc")), kind.ready, group=True)
                hostile.append(await stack.enter_async_context(running(proc)))
            await asyncio.sleep(2.0)  # let it misbehave before measuring (it is the point)
        stop = asyncio.Event()
        statuses: list[int] = []
        served: list[str] = []
        async with asyncio.TaskGroup() as group:
            sampler = group.create_task(sample_daemon(http, front, d.pid, stop))
            extra = None
            if kind is not None and kind.trickle is not None:
                extra = group.create_task(trickle(http, front, kind.trickle, statuses))
                async with asyncio.timeout(120):  # its first answer: it is at work
                    while not statuses:  # noqa: ASYNC110 - a benchmark's pacing
                        await asyncio.sleep(0.1)
            try:
                samples = await measure(http, front, requests, served)
            finally:
                stop.set()
                if extra is not None:
                    extra.cancel()
        peak, health = sampler.result()
        verdict = await _verdict(d, hostile, statuses, served) if kind is not None else "-"
    return Sample(
        kind.name if kind else "none attached", Stats.of(samples), Stats.of(health), peak, verdict
    )


async def _verdict(d: Proc, hostile: list[Proc], statuses: list[int], served: list[str]) -> str:
    """How the hostile worker was reported, and what it got of the honest requests; for
    a hostile caller, how many of its streams were let open."""
    if all(proc.ready_line.startswith('{"open"') for proc in hostile):
        said = [json.loads(proc.ready_line) for proc in hostile]
        return "; ".join(
            f"{r['open']} streams open, refused: "
            + (", ".join(f"{code} x{n}" for code, n in r["refused"].items()) or "none")
            for r in said
        )
    listing = await _listing(d)
    ids = {ident for proc in hostile if (ident := _field(proc, "id"))}
    took = sum(1 for worker in served if worker in ids)
    said = [f"served {took} of {len(served)} honest requests"]
    for ident in sorted(ids):
        engine = listing.get(ident, {}).get("engine")
        if engine is not None and not engine.get("healthy", True):
            kind = re.search(r"\((\w+)\)", str(engine.get("reason", "")))
            said.append(f"marked unhealthy ({kind.group(1) if kind else 'reason given'})")
            break
    if statuses:
        counted = ", ".join(f"{s} x{statuses.count(s)}" for s in sorted(set(statuses)))
        said.append(f"its own requests answered {counted}")
    return "; ".join(said)


def _field(proc: Proc, name: str) -> str | None:
    try:
        return proc.field(name)
    except AssertionError:
        return None


async def _listing(d: Proc) -> dict[str, dict[str, Any]]:
    socket = d.field("grpc").removeprefix("unix://")
    done = await asyncio.create_subprocess_exec(
        *dynamoctl("--endpoint", f"unix://{socket}", "workers", "ls", "-o", "json"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=env(),
    )
    out, _ = await done.communicate()
    return {w["id"]: w for w in json.loads(out or b"[]")}


@contextlib.asynccontextmanager
async def fleet(where: Path) -> AsyncIterator[tuple[Proc, str]]:
    store = (where / "store").as_uri()
    async with contextlib.AsyncExitStack() as stack:
        d = await stack.enter_async_context(running(daemon(store, where / "d.sock", **HOSTILE_ENV)))
        for _ in range(2):
            await stack.enter_async_context(running(worker(store, model=MODEL)))
        yield d, store


async def run(args: argparse.Namespace) -> list[Sample]:
    samples: list[Sample] = []
    with tempfile.TemporaryDirectory(prefix="dynamod-hostile-") as tmp:
        async with fleet(Path(tmp)) as (d, store), aiohttp.ClientSession() as http:
            await measure(http, d.field("http"), 50)  # warm up
            samples.append(await round_(http, d, args.requests, None, store))
            for kind in (k for k in KINDS if args.only in k.name):
                print(f"# {kind.name}", file=sys.stderr, flush=True)
                samples.append(await round_(http, d, args.requests, kind, store))
            samples.append(await round_(http, d, args.requests, None, store))
    return samples


def table(samples: Sequence[Sample]) -> str:
    base = samples[0]
    rows = [
        [
            s.kind,
            f"{s.front.p50_ms:.2f}",
            f"{s.front.p99_ms:.2f}",
            f"{s.front.p99_ms / base.front.p99_ms:.2f}x",
            f"{s.health.p99_ms:.2f}",
            f"{s.peak_rss_mb:.0f}",
            f"{s.peak_rss_mb / base.peak_rss_mb:.2f}x",
            s.verdict,
        ]
        for s in samples
    ]
    headers = [
        "attached",
        "front p50 ms",
        "p99 ms",
        "p99 vs none",
        "/health p99 ms",
        "daemon RSS MB",
        "vs none",
        "the hostile process",
    ]
    return render_table(headers, rows)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.hostile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--requests", type=int, default=300, help="honest requests per round (300)")
    parser.add_argument("--json", type=Path, help="where to write the results")
    parser.add_argument(
        "--only", default="", metavar="TEXT", help="only the kinds whose name holds TEXT"
    )
    args = parser.parse_args(argv)
    if args.requests < 10:
        parser.error(f"--requests {args.requests} must be at least 10")
    if not any(args.only in kind.name for kind in KINDS):
        parser.error(f"--only {args.only!r} matches no kind: {', '.join(k.name for k in KINDS)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    started = time.monotonic()
    samples = asyncio.run(run(args))
    detail = f"{args.requests} honest requests a round; 2 mocker workers; file store"
    print(header("honest traffic with one hostile process attached", versions(), detail))
    print(table(samples))
    print(
        f"# load average after: {' '.join(f'{x:.1f}' for x in psutil.getloadavg())}; "
        f"{time.monotonic() - started:.0f} s"
    )
    document = {
        "benchmark": "hostile",
        "config": {"requests": args.requests, "python": platform.python_version()},
        "rows": [
            {
                "kind": s.kind,
                "front": stats_json(s.front),
                "health": stats_json(s.health),
                "peak_rss_mb": s.peak_rss_mb,
                "verdict": s.verdict,
            }
            for s in samples
        ],
        "table": table(samples),
    }
    write_result(document, "hostile", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(interruptible(lambda: main()))
