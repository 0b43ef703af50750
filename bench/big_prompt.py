"""What the daemon answers while it reads huge requests: ``/health`` and gRPC
``GetStatus`` latency while its front serves or refuses 7-15 MB bodies, and how long one
huge body would stall an event loop read on the loop, in a thread, or in a prompt worker
process (``dynamod/prompts``).

    python -m bench.big_prompt                 # 6 huge requests per case
    python -m bench.big_prompt --requests 10 --json out.json

Part 1, real processes: one ``dynamo-worker`` (mocker) and one ``dynamod`` on a file
store. A prober sends ``GET /health`` and ``GetStatus`` (unix socket), one after the
other, back to back, while a client sends ``--requests`` huge bodies to the front one
after another. Cases: ``idle`` (no huge request: the floor), ``refused`` (a 7 MB text
prompt, tokenized and refused with 400: it overflows the model's context), ``served`` (a
7 MB body whose prompt is short, parsed and forwarded to the worker: 200), ``too large``
(15 MB, refused with 413 by the body limit as it arrives). Target: p99 ≤ 50 ms.

Part 2, in this process: reading one 7 MB refused body (parse, check, tokenize with the
mocker's tokenizer) while a 1 ms ticker runs on the loop; the longest gap between ticks is
the longest the loop could not answer anything. The same read on the loop, in a thread
(``asyncio.to_thread``) and in a ``PromptProcesses`` process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import platform
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.common import Stats, interruptible, ms, owned, render_table, stats_json, write_json
from dynamod.client import AsyncClient
from dynamod.http.openai import COMPLETIONS, FieldError, json_object
from dynamod.prompts.body import CardLimits, read_prompt
from dynamod.prompts.processes import PromptProcesses
from dynamod.tokenizers import SimpleTokenizer
from tests.support.processes import Proc, daemon, running, worker

MODEL = "llama"
SENTENCE = "the quick brown fox jumps over the lazy dog "


def refused_body(size: int) -> bytes:
    return orjson.dumps({"model": MODEL, "prompt": SENTENCE * (size // len(SENTENCE))})


def served_body(size: int) -> bytes:
    return orjson.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1, "user": "x" * size})


CASES: dict[str, tuple[Callable[[int], bytes] | None, int, int]] = {
    "idle": (None, 0, 0),
    "refused 7 MB": (refused_body, 7_000_000, 400),
    "served 7 MB": (served_body, 7_000_000, 200),
    "too large 15 MB": (refused_body, 15_000_000, 413),
}


async def probe(http: aiohttp.ClientSession, health: str, client: AsyncClient, into: Any) -> None:
    """``/health`` and ``GetStatus``, back to back, until cancelled."""
    while True:
        started = time.perf_counter_ns()
        async with http.get(health) as reply:
            await reply.read()
            assert reply.status == 200, reply.status
        into["/health"].append(time.perf_counter_ns() - started)
        started = time.perf_counter_ns()
        await client.status()
        into["GetStatus"].append(time.perf_counter_ns() - started)


async def huge(http: aiohttp.ClientSession, url: str, body: bytes, expect: int) -> None:
    headers = {"Content-Type": "application/json"}
    try:
        async with http.post(url, data=io.BytesIO(body), headers=headers) as reply:
            await reply.read()
            status = reply.status
    except aiohttp.ClientError:  # a 413 may close the connection before the body is sent
        status = 413
    assert status == expect, f"expected {expect}, got {status}"


async def one_case(
    http: aiohttp.ClientSession, front: str, client: AsyncClient, case: str, requests: int
) -> dict[str, Stats]:
    make, size, expect = CASES[case]
    samples: dict[str, list[int]] = {"/health": [], "GetStatus": []}
    async with owned(probe(http, front + "/health", client, samples), "prober"):
        if make is None:
            await asyncio.sleep(2.0)
        else:
            body = make(size)
            for _ in range(requests):
                await huge(http, front + COMPLETIONS.path, body, expect)
    return {name: Stats.of(series) for name, series in samples.items()}


@contextlib.asynccontextmanager
async def fleet(where: Path) -> AsyncIterator[tuple[str, str]]:
    store = (where / "store").as_uri()
    async with running(worker(store)), running(daemon(store, where / "d.sock")) as proc:
        yield _field(proc, "http"), f"unix://{where / 'd.sock'}"


def _field(proc: Proc, name: str) -> str:
    return proc.field(name)


async def part1(requests: int) -> dict[str, dict[str, Stats]]:
    results: dict[str, dict[str, Stats]] = {}
    with tempfile.TemporaryDirectory() as where:
        async with (
            fleet(Path(where)) as (front, socket),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http,
            AsyncClient(socket) as client,
        ):
            # The first huge body starts the prompt worker process: not measured.
            await huge(http, front + COMPLETIONS.path, refused_body(100_000), 400)
            for case in CASES:
                results[case] = await one_case(http, front, client, case, requests)
    return results


def read_refused(raw: bytes) -> None:
    try:
        read_prompt(json_object(raw), raw, COMPLETIONS, SimpleTokenizer(), _MODEL)
    except FieldError:
        return
    raise AssertionError("the huge prompt was not refused")


_MODEL = CardLimits(block_size=16, context_length=8192, checked=True)


async def stall(read: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """The longest gap between 1 ms ticks while ``read`` runs, and how long it ran (ms)."""
    gaps: list[int] = []

    async def tick() -> None:
        last = time.perf_counter_ns()
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter_ns()
            gaps.append(now - last)
            last = now

    started = time.perf_counter_ns()
    async with owned(tick(), "ticker"):
        await asyncio.sleep(0.01)
        await read()
        await asyncio.sleep(0.01)  # the ticker notes the gap the read left
    return max(gaps) / 1e6, (time.perf_counter_ns() - started) / 1e6


async def part2() -> list[list[str]]:
    raw = refused_body(7_000_000)
    rows = []

    async def on_loop() -> None:
        read_refused(raw)

    async def in_thread() -> None:
        await asyncio.to_thread(read_refused, raw)

    async with PromptProcesses(1) as workers:
        await _refused_by(workers, refused_body(100_000))  # start the process: not measured

        async def in_process() -> None:
            await _refused_by(workers, raw)

        for name, read in (
            ("on the loop", on_loop),
            ("thread", in_thread),
            ("process", in_process),
        ):
            gap, took = await stall(read)
            rows.append([name, f"{gap:.1f}", f"{took:.0f}"])
    return rows


async def _refused_by(workers: PromptProcesses, raw: bytes) -> None:
    try:
        await workers.read_prompt(raw, COMPLETIONS, SimpleTokenizer(), _MODEL)
    except FieldError:
        return
    raise AssertionError("the huge prompt was not refused")


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=6, help="huge requests per case")
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    print(
        f"# big_prompt: {args.requests} huge requests per case; "
        f"python {platform.python_version()}\n"
    )
    results = asyncio.run(part1(args.requests))
    rows = [
        [case, probe_name, str(s.n), ms(s.p50_ms), ms(s.p99_ms), ms(s.max_ms)]
        for case, found in results.items()
        for probe_name, s in found.items()
    ]
    print(render_table(["case", "probe", "n", "p50 ms", "p99 ms", "max ms"], rows))
    stalls = asyncio.run(part2())
    print("\n# one 7 MB refused body read while a 1 ms ticker runs on the loop\n")
    print(render_table(["read", "longest loop gap ms", "read took ms"], stalls))
    write_json(
        args.json,
        {
            "probes": {
                case: {name: stats_json(s) for name, s in found.items()}
                for case, found in results.items()
            },
            "stalls": {
                row[0]: {"gap_ms": float(row[1]), "took_ms": float(row[2])} for row in stalls
            },
        },
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return interruptible(lambda: run(parse(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
