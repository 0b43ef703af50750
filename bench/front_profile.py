"""Where the front's time goes, and what it adds to a stream.

    python -m bench.front_profile                  # 300 profiled requests, 100 streams
    python -m bench.front_profile --requests 1000 --streams 200 --json out.json

Setup as ``bench.front``: one ``dynamo-worker`` (mocker, ``--speedup-ratio 1000``) in a
file store; a ``WorkerView`` → ``Router`` → ``Frontend`` in this process on loopback.

Part 1, the breakdown: ``--requests`` sequential one-token completions through the front
under ``cProfile``. A coroutine's profile counts only while it runs (not while it awaits
the worker), so each row is CPU time per request spent in that part of the front, and its
share of the request handler's (``Frontend._serve``). ``aiohttp server`` is what the
server around the handler costs (``RequestHandler._handle_request`` minus the handler):
parsing the request and writing the response. The profiler slows every call, so compare
shares, not absolute times; the wall-clock p50 with and without it is printed too.

Part 2, streams: ``--streams`` streamed completions of 32 tokens each way (straight to the
worker, the floor, and through the front), in alternating blocks of 10: time to the first
event (TTFB) and the gap between consecutive events as the client reads them, p50 / p99
(the front may hand on several events in one read, which shortens its gaps).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import platform
import pstats
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import (
    Stats,
    header,
    interruptible,
    ms,
    places,
    render_table,
    stats_json,
    write_json,
)
from bench.front import MODEL, one, worker_and_front

WARMUP = 50
STREAM_BLOCK = 10
STREAM_TOKENS = 32

PARTS: tuple[tuple[str, str, str], ...] = (
    ("read the head (parse, model, nvext)", "prompts/reader.py", "read_head"),
    ("check and tokenize (tokenizer, prepare)", "frontend/front.py", "_read_prompt"),
    ("route (router acquire)", "router/router.py", "acquire"),
    ("release the worker", "router/router.py", "release"),
    ("send to the worker (until its headers)", "frontend/relay.py", "send"),
    ("relay the answer", "frontend/relay.py", "relay_whole"),
)
HANDLER = ("frontend/front.py", "_serve")
SERVER = ("aiohttp/web_protocol.py", "_handle_request")


def _cumulative(stats: pstats.Stats, where: str, name: str) -> float:
    """Seconds of cumulative time of every function ``name`` in a file ending ``where``."""
    table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    return sum(
        float(row[3])
        for (path, _line, func), row in table.items()
        if func == name and path.endswith(where)
    )


async def profiled(
    http: aiohttp.ClientSession, url: str, worker_id: str, n: int
) -> tuple[list[list[str]], dict[str, float]]:
    plain = [await one(http, url, worker_id) for _ in range(n)]
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        traced = [await one(http, url, worker_id) for _ in range(n)]
    finally:
        profiler.disable()
    stats = pstats.Stats(profiler)
    handler = _cumulative(stats, *HANDLER)
    server = _cumulative(stats, *SERVER) - handler
    rows, found = [], {}
    for label, where, name in PARTS:
        seconds = _cumulative(stats, where, name)
        found[label] = seconds / n * 1e6
        rows.append([label, f"{seconds / n * 1e6:.0f}", f"{seconds / handler * 100:.0f}%"])
    accounted = sum(_cumulative(stats, where, name) for _label, where, name in PARTS)
    rest = handler - accounted
    rows.append(
        [
            "the rest (body read, dispatch, metrics)",
            f"{rest / n * 1e6:.0f}",
            f"{rest / handler * 100:.0f}%",
        ]
    )
    rows.append(["= the handler (Frontend._serve)", f"{handler / n * 1e6:.0f}", "100%"])
    rows.append(
        [
            "aiohttp server around the handler",
            f"{server / n * 1e6:.0f}",
            f"{server / handler * 100:.0f}%",
        ]
    )
    found["rest"] = rest / n * 1e6
    found["handler"] = handler / n * 1e6
    found["aiohttp server"] = server / n * 1e6
    found["wall p50 ms"] = Stats.of(plain).p50_ms
    found["wall p50 ms profiled"] = Stats.of(traced).p50_ms
    return rows, found


async def stream_once(http: aiohttp.ClientSession, url: str) -> tuple[int, list[int]]:
    """One streamed completion: ns to its first event, and ns between its events."""
    body = {"model": MODEL, "prompt": "a stream", "max_tokens": STREAM_TOKENS, "stream": True}
    started = time.perf_counter_ns()
    first, gaps, last = 0, [], 0
    async with http.post(url, json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{url} answered {response.status}")
        async for line in response.content:
            if not line.startswith(b"data:"):
                continue
            now = time.perf_counter_ns()
            if not first:
                first = now - started
            else:
                gaps.append(now - last)
            last = now
    return first, gaps


async def streams(
    http: aiohttp.ClientSession, targets: dict[str, str], n: int
) -> dict[str, dict[str, Stats]]:
    ttfb: dict[str, list[int]] = {name: [] for name in targets}
    gaps: dict[str, list[int]] = {name: [] for name in targets}
    for url in targets.values():
        for _ in range(STREAM_BLOCK):
            await stream_once(http, url)
    while len(ttfb["front"]) < n:
        for name, url in targets.items():
            for _ in range(min(STREAM_BLOCK, n - len(ttfb[name]))):
                first, between = await stream_once(http, url)
                ttfb[name].append(first)
                gaps[name] += between
    return {name: {"ttfb": Stats.of(ttfb[name]), "gap": Stats.of(gaps[name])} for name in targets}


async def measure(url: str, requests: int, stream_count: int) -> dict[str, Any]:
    async with worker_and_front(url) as (proc, front_url, http):
        path = "/v1/completions"
        for _ in range(WARMUP):
            await one(http, front_url + path, proc.field("id"))
        rows, found = await profiled(http, front_url + path, proc.field("id"), requests)
        targets = {"direct": proc.field("http") + path, "front": front_url + path}
        streamed = await streams(http, targets, stream_count)
    return {"rows": rows, "parts_us": found, "streams": streamed}


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.front_profile", description=__doc__)
    parser.add_argument("--requests", type=int, default=300, help="profiled requests")
    parser.add_argument("--streams", type=int, default=100, help="streams each way")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.streams < 1:
        parser.error("--requests and --streams must be at least 1")
    return args


def run(args: argparse.Namespace) -> int:
    found = {"python": platform.python_version(), "aiohttp": aiohttp.__version__}
    detail = (
        f"{args.requests} profiled one-token completions; {args.streams} streams of "
        f"{STREAM_TOKENS} tokens each way; one mocker worker"
    )
    print(header("front profile", found, detail))
    with places(["file"]) as where:
        result = asyncio.run(measure(where.urls["file"], args.requests, args.streams))
    print(render_table(["part", "µs / request (profiled)", "share"], result["rows"]))
    parts = result["parts_us"]
    print(
        f"\nwall p50 {ms(parts['wall p50 ms'])} ms; "
        f"{ms(parts['wall p50 ms profiled'])} ms under the profiler\n"
    )
    stream_rows = []
    for what in ("ttfb", "gap"):
        direct = result["streams"]["direct"][what]
        for name, found_stats in result["streams"].items():
            s = found_stats[what]
            extra = "floor" if name == "direct" else f"{s.p50_ms - direct.p50_ms:+.3f} ms"
            stream_rows.append([what, name, str(s.n), ms(s.p50_ms), ms(s.p99_ms), extra])
    print(render_table(["stream", "path", "n", "p50 ms", "p99 ms", "overhead p50"], stream_rows))
    write_json(
        args.json,
        {
            "benchmark": "front_profile",
            "versions": found,
            "requests": args.requests,
            "rows": result["rows"],
            "parts_us": parts,
            "streams": {
                name: {what: stats_json(s) for what, s in found_stats.items()}
                for name, found_stats in result["streams"].items()
            },
        },
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return interruptible(lambda: run(parse(argv)))


if __name__ == "__main__":
    sys.exit(main())
