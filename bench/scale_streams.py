"""dynamod following a fleet's engine events streams: the cost of each followed worker, and
of a partition of half of them.

    python -m bench.scale_streams                      # 1,000 streaming workers, on etcd
    python -m bench.scale_streams --workers 10000 --json out.json

``bench.scale`` registers records without an engine stream; here every record offers one.
One real mocker worker (``dynamo-worker``) registers in a scratch store; its record is
cloned ``--workers`` times into etcd, each clone's ``system_address`` a stream of its own
on one ``bench.stream_server`` (a snapshot, then a heartbeat every 2 s, as a worker sends;
the rest of a worker's routes relayed to the mocker), its inference address the mocker's,
so a routed request gets a real answer. A second dynamod follows a fleet of one: the
mocker's own record, its real stream (the baseline). Both run side by side.

Three phases, each reported as a row:

* ``open``: every stream open (``dynamod_engine_streams_open``), none marked;
* ``partition``: every second stream silent (the server stops sending and answering them,
  as behind a partition) until their line deadline marked each of them;
* ``healed``: the partition over, every mark lifted.

Columns: ``streams`` open and ``marked`` at the end of the phase; ``request p50`` through
the front and ``x 1`` over the baseline's, round-robin with it (``--requests`` each),
``not 200`` the fleet's requests that got another status (counted, left out of the p50);
``ls -o json s``: ``dynamoctl workers ls -o json`` of the whole fleet, p50 of 3;
``RSS MB``; ``CPU %``: the daemon's CPU (user + system, % of one core) over a ``--sample``
second window of the phase; ``log lines``: the daemon's stderr lines during the phase;
``s``: how long the phase took to reach its condition (a partition: to mark half of them;
healed: to lift every mark). The per-stream costs below the table are the ``open`` row
less the baseline's, divided by the streams.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from bench.common import (
    Stats,
    header,
    interruptible,
    ms,
    places,
    render_table,
    versions,
    write_json,
)
from dynamod.discovery.registration import new_instance_id, register
from dynamod.records import WorkerRecord
from dynamod.store import Store, open_store
from tests.support.processes import Proc, daemon_argv, dynamoctl, env, running, worker
from tests.support.scrape import scrape

MODEL = "scale"
LEASE_TTL = 3600.0
REGISTER_CONCURRENCY = 128
WITHIN = 600.0
READY_WITHIN = 300.0
"""Seconds a daemon may take to be ready: 10,000 records on two shared cores."""
"""Seconds a phase may take to reach its condition before the run fails."""


@dataclass
class Row:
    phase: str
    workers: int
    streams: int
    marked: int
    request_p50_ms: float
    over_baseline: float
    failed: int
    ls_json_s: float
    rss_mb: float
    cpu_percent: float
    log_lines: int
    took_s: float
    baseline_rss_mb: float
    baseline_cpu_percent: float

    def cells(self) -> list[str]:
        return [
            self.phase, f"{self.workers:,}", f"{self.streams:,}", f"{self.marked:,}",
            ms(self.request_p50_ms), f"{self.over_baseline:.2f}", str(self.failed),
            f"{self.ls_json_s:.2f}",
            f"{self.rss_mb:.0f}", f"{self.cpu_percent:.0f}", str(self.log_lines),
            f"{self.took_s:.1f}",
        ]  # fmt: skip


HEADERS = (
    "phase", "workers", "streams", "marked", "request p50", "x 1", "not 200", "ls -o json s",
    "RSS MB",
    "CPU %", "log lines", "s",
)  # fmt: skip


async def metrics(http: aiohttp.ClientSession, front: str) -> dict[str, float]:
    return await scrape(http, front + "/metrics")


async def until(
    probe: Callable[[], Awaitable[dict[str, float]]], accept: Callable[[dict[str, float]], bool]
) -> float:
    """Seconds until ``accept(await probe())``; fails past ``WITHIN``."""
    started = time.perf_counter()
    async with asyncio.timeout(WITHIN):
        while not accept(await probe()):  # noqa: ASYNC110 - another process: no event
            await asyncio.sleep(0.5)
    return time.perf_counter() - started


async def routing(fronts: dict[int, str], requests: int) -> dict[int, tuple[Stats, int]]:
    """Request latency per fleet size over ``requests`` rounds of one request to every
    front (they take turns, so load from elsewhere falls on all alike), and how many did
    not answer 200 (counted, not timed: a 504 of a starved mocker is the machine's)."""
    body = {"model": MODEL, "prompt": "the quiet river runs north", "max_tokens": 1}
    samples: dict[int, list[int]] = {n: [] for n in fronts}
    failed = dict.fromkeys(fronts, 0)
    async with aiohttp.ClientSession() as http:
        for round_ in range(requests + 5):  # 5 rounds of warm-up
            for size, front in fronts.items():
                started = time.perf_counter_ns()
                async with http.post(front + "/v1/completions", json=body) as reply:
                    await reply.read()
                took = time.perf_counter_ns() - started
                if reply.status != 200:
                    failed[size] += 1
                elif round_ >= 5:
                    samples[size].append(took)
    return {n: (Stats.of(samples[n] or [0]), failed[n]) for n in fronts}


async def clone_fleet(store: Store, record: WorkerRecord, streams: str, size: int) -> None:
    lease = await store.grant(LEASE_TTL)
    gate = asyncio.Semaphore(REGISTER_CONCURRENCY)

    async def one(index: int) -> None:
        clone = dataclasses.replace(
            record, instance_id=new_instance_id(), system_address=f"{streams}/w{index}"
        )
        async with gate:
            await register(store, clone, lease)

    async with asyncio.TaskGroup() as group:
        for index in range(size):
            group.create_task(one(index))


async def ls_json(socket: Path, repeat: int = 3) -> float:
    """p50 seconds of ``dynamoctl workers ls -o json``."""
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        process = await asyncio.create_subprocess_exec(
            *dynamoctl("--endpoint", f"unix://{socket}", "--timeout", "120", "workers", "ls",
                       "-o", "json"),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env(),
        )  # fmt: skip
        _, err = await process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"workers ls -o json failed: {err.decode()}")
        samples.append(time.perf_counter() - started)
    return sorted(samples)[len(samples) // 2]


async def cpu_percent(pid: int, seconds: float) -> float:
    process = psutil.Process(pid)
    before, started = process.cpu_times(), time.perf_counter()
    await asyncio.sleep(seconds)
    after = process.cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    return 100 * used / (time.perf_counter() - started)


@dataclass(frozen=True)
class Fleet:
    size: int
    proc: Proc
    socket: Path
    baseline: Proc
    streams: str

    @property
    def front(self) -> str:
        return self.proc.field("http")


async def phase(
    fleet: Fleet, name: str, took: float, lines_from: int, args: argparse.Namespace
) -> Row:
    async with aiohttp.ClientSession() as http:
        cpu, base_cpu = await asyncio.gather(
            cpu_percent(fleet.proc.pid, args.sample), cpu_percent(fleet.baseline.pid, args.sample)
        )
        found = await metrics(http, fleet.front)
    fronts = {1: fleet.baseline.field("http"), fleet.size: fleet.front}
    routed = await routing(fronts, args.requests)
    p50, base = routed[fleet.size][0].p50_ms, routed[1][0].p50_ms
    failed = routed[fleet.size][1]
    listed = await ls_json(fleet.socket)
    rss = psutil.Process(fleet.proc.pid).memory_info().rss / 2**20
    base_rss = psutil.Process(fleet.baseline.pid).memory_info().rss / 2**20
    lines = len(fleet.proc.stderr.splitlines()) - lines_from
    streams = int(found.get("dynamod_engine_streams_open", -1))
    marked = int(found.get("dynamod_workers_marked", -1))
    print(f"  {name}: measured", file=sys.stderr, flush=True)
    return Row(name, fleet.size, streams, marked, p50, p50 / max(base, 1e-9), failed, listed,
               rss, cpu, lines, took, base_rss, base_cpu)  # fmt: skip


async def phases(fleet: Fleet, args: argparse.Namespace) -> list[Row]:
    total, half = fleet.size, (fleet.size + 1) // 2
    rows = []
    async with aiohttp.ClientSession() as http:

        async def probe() -> dict[str, float]:
            return await metrics(http, fleet.front)

        mark = len(fleet.proc.stderr.splitlines())
        took = await until(
            probe,
            lambda m: (
                m.get("dynamod_engine_streams_open") == total
                and m.get("dynamod_workers_marked") == 0
            ),
        )
        rows.append(await phase(fleet, "open", took, mark, args))
        mark = len(fleet.proc.stderr.splitlines())
        async with http.post(f"{fleet.streams}/partition?every=2") as reply:
            reply.raise_for_status()
        took = await until(probe, lambda m: m.get("dynamod_workers_marked", 0) >= half)
        rows.append(await phase(fleet, "partition", took, mark, args))
        mark = len(fleet.proc.stderr.splitlines())
        async with http.post(f"{fleet.streams}/heal") as reply:
            reply.raise_for_status()
        took = await until(
            probe,
            lambda m: (
                m.get("dynamod_workers_marked") == 0
                and m.get("dynamod_engine_streams_open") == total
            ),
        )
        rows.append(await phase(fleet, "healed", took, mark, args))
    return rows


@contextlib.asynccontextmanager
async def mocker(scratch: Path) -> AsyncIterator[tuple[Proc, WorkerRecord]]:
    """One real mocker worker in a scratch file store, and its record."""
    url = (scratch / "mocker-store").as_uri()
    proc = worker(url, "--speedup-ratio", "1000", "--lease-ttl", "30", model=MODEL)
    async with running(proc):
        store = await open_store(url)
        try:
            entry = await store.get(proc.field("key"))
        finally:
            await store.aclose()
        assert entry is not None
        yield proc, WorkerRecord.from_bytes(entry.value)


async def measure(endpoint: str, scratch: Path, args: argparse.Namespace) -> list[Row]:
    async with contextlib.AsyncExitStack() as stack:
        real, record = await stack.enter_async_context(mocker(scratch))
        server = Proc(
            [sys.executable, "-m", "bench.stream_server", "--upstream", real.field("system")],
            r"^stream server ready:",
        )
        await stack.enter_async_context(running(server))
        streams = server.field("http")
        stores = {}
        for size in (1, args.workers):
            url = f"etcd://{endpoint}/scale-streams-{size}"
            stores[size] = await stack.enter_async_context(await open_store(url))
        lease = await stores[1].grant(LEASE_TTL)
        await register(stores[1], dataclasses.replace(record, instance_id=new_instance_id()), lease)
        await clone_fleet(stores[args.workers], record, streams, args.workers)
        procs = {}
        for size in (1, args.workers):
            socket = scratch / f"streams-{size}.sock"
            argv = daemon_argv(f"etcd://{endpoint}/scale-streams-{size}", socket)
            if args.nofile and size > 1:  # as systemd starts a unit without LimitNOFILE
                argv = ["prlimit", f"--nofile={args.nofile}", "--", *argv]
            procs[size] = Proc(argv, r"^dynamod ready:")
            stack.push_async_callback(procs[size].kill)
            await procs[size].start(within=READY_WITHIN)
        fleet = Fleet(args.workers, procs[args.workers], scratch / f"streams-{args.workers}.sock",
                      procs[1], streams)  # fmt: skip
        return await phases(fleet, args)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.scale_streams", description=__doc__)
    parser.add_argument("--workers", type=int, default=1000, help="streaming workers")
    parser.add_argument("--requests", type=int, default=100, help="routed requests a phase")
    parser.add_argument("--sample", type=float, default=10.0, help="CPU window, seconds")
    parser.add_argument(
        "--nofile", default="", help="SOFT:HARD open-files limits of the fleet's daemon (prlimit)"
    )
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.workers < 2 or args.requests < 1 or args.sample <= 0:
        parser.error("--workers must be at least 2, --requests 1, --sample above 0")
    return args


def per_stream(rows: list[Row]) -> dict[str, Any]:
    """The ``open`` row's CPU and RSS less the baseline daemon's (one stream), per stream."""
    opened = rows[0]
    cpu = (opened.cpu_percent - opened.baseline_cpu_percent) / opened.streams * 1000
    rss = (opened.rss_mb - opened.baseline_rss_mb) * 1024 / opened.streams
    return {"cpu_percent_per_1000_streams": cpu, "rss_kb_per_stream": rss}


def run(args: argparse.Namespace) -> int:
    found = versions()
    detail = f"{args.workers:,} streaming workers on etcd, {args.requests} requests a phase"
    if args.nofile:
        detail += f", the fleet's daemon started with open files {args.nofile}"
    print(header("dynamod following engine streams", found, detail))
    with places(["etcd"], bucket="scale-streams") as where:
        rows = asyncio.run(measure(where.etcd_endpoint or "", where.scratch, args))
    print(render_table(HEADERS, [r.cells() for r in rows]))
    costs = per_stream(rows)
    print(
        f"per stream (open, less the baseline): {costs['cpu_percent_per_1000_streams']:.1f} % "
        f"of a core per 1,000 streams, {costs['rss_kb_per_stream']:.0f} KB RSS"
    )
    write_json(
        args.json,
        {
            "benchmark": "scale_streams",
            "versions": found,
            "config": {k: str(v) for k, v in vars(args).items()},
            "rows": [dataclasses.asdict(r) for r in rows],
            "per_stream": costs,
        },
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return interruptible(lambda: run(parse(argv)))


if __name__ == "__main__":
    sys.exit(main())
