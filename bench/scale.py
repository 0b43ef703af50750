"""dynamod with a large fleet: start-up, memory, listing, propagation and routing.

    python -m bench.scale                              # etcd and nats, 10, 1,000 and 10,000
    python -m bench.scale --workers 2000 --backends etcd --json out.json

The fleet is *registrations*, not processes: this process writes ``--workers`` worker
records under one long lease (no keep-alive traffic during the run), each with a capacity,
a pool and a zone taint, all pointing at one real mocker worker (``dynamo-worker``, fast
speed-up ratio) so that routed requests get a real answer. Every backend is measured at
three fleet sizes, ``10`` (the baseline), ``--workers / 10`` and ``--workers``, each in a
fresh key prefix (etcd) or bucket (NATS), with a fresh ``dynamod``:

* ``ready s``: from spawning ``dynamod`` to its readiness line (store opened, first
  snapshot applied, sockets bound); the floor is a bare ``Store.list`` of the prefix from
  this process (``list floor ms``);
* ``RSS MB``: the daemon's resident memory once ready (``psutil``);
* ``ListWorkers``: p50 of the API call through ``dynamod.api.client`` (what ``dynamoctl
  workers ls`` uses); when that client cannot take the answer, the error is shown and the
  figure comes from a raw channel with a 256 MB receive limit (marked ``raw``);
* ``propagation``: from ``update_taints`` returning in this process to the change
  arriving on an ``events tail`` stream of the daemon (p50 / p99 of ``--updates``), for
  64 probe workers spread over the rounds (the stream selects them by a taint);
* ``request``: a real completion through the front, p50, requiring ``capacity/fast``
  (half the fleet eligible) or three taints (a twentieth), two preferred taints scored;
  ``decision``: the daemon's mean routing decision time over the same requests, from its
  ``dynamod_router_decision_seconds`` histogram.

Compare each row with the baseline row of its backend: that is the cost of the fleet.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import psutil
from prometheus_client.parser import text_string_to_metric_families

from bench.common import (
    SERVER_BACKENDS,
    Stats,
    header,
    interruptible,
    ms,
    places,
    render_table,
    stats_json,
    versions,
    write_json,
)
from dynamod.api.v1 import dynamo_pb2 as pb
from dynamod.api.v1 import dynamo_pb2_grpc as rpc
from dynamod.client import AsyncClient
from dynamod.discovery.records import register, update_taints
from dynamod.errors import DynamoError
from dynamod.model import WORKERS_PREFIX
from dynamod.store import Lease, Store, open_store
from dynamod.taints import TaintUpdate
from tests.factories import make_record
from tests.procs import Proc, daemon, running, worker

MODEL = "scale"
BASELINE = 10
LEASE_TTL = 3600.0  # outlives the run: no keep-alive traffic to measure around
REGISTER_CONCURRENCY = 128
RAW_RECEIVE_LIMIT = 256 * 2**20
PREFERRED = {"pool=p1": 0.5, "zone=z3": -0.3}
REQUIRED = {
    "1/2": ["capacity/fast"],  # half the fleet eligible: scoring dominates
    "1/20": ["capacity/fast", "pool=p1", "zone=z1"],  # a twentieth (index 1 mod 20)
}


def body(required: list[str]) -> dict[str, Any]:
    constraints = {"required_taints": required, "preferred_taints": PREFERRED}
    return {
        "model": MODEL,
        "prompt": "the quiet river runs north",
        "max_tokens": 1,
        "nvext": {"routing_constraints": constraints},
    }


PROBE = "bench/probe"
PROBES = 64  # workers carrying PROBE: the ones propagation rounds update


def fleet_taints(index: int) -> list[str]:
    speed = "capacity/fast" if index % 2 else "capacity/slow"
    probe = [PROBE] if index < PROBES else []
    return [speed, f"pool=p{index % 4}", f"zone=z{index % 5}", *probe]


async def register_fleet(store: Store, size: int, address: str) -> list[str]:
    """``size`` records under one lease, ``REGISTER_CONCURRENCY`` writes at a time; the
    keys of the probe workers."""
    lease: Lease = await store.grant(LEASE_TTL)
    gate = asyncio.Semaphore(REGISTER_CONCURRENCY)
    probes: dict[int, str] = {}

    async def one(index: int) -> None:
        record = make_record(model=MODEL, taints=fleet_taints(index), address=address)
        async with gate:
            key = (await register(store, record, lease))[0].key
        if index < PROBES:
            probes[index] = key

    async with asyncio.TaskGroup() as group:
        for index in range(size):
            group.create_task(one(index))
    return [probes[i] for i in sorted(probes)]


async def timed(call: Any, repeat: int) -> Stats:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter_ns()
        await call()
        samples.append(time.perf_counter_ns() - started)
    return Stats.of(samples)


# -- one point: a backend at a fleet size ------------------------------------------------------


@dataclass
class Point:
    backend: str
    workers: int
    register_s: float
    list_floor: Stats
    ready_s: float
    rss_mb: float
    list_workers: Stats
    list_raw: bool  # measured on a raw channel: the product client refused the answer
    list_error: str
    propagation: Stats
    propagation_ns: list[int]
    request: dict[str, Stats]  # by the share of the fleet the request's taints select
    decision_us: dict[str, float]

    def cells(self) -> list[str]:
        listed = ms(self.list_workers.p50_ms) + (" raw" if self.list_raw else "")
        return [
            self.backend,
            f"{self.workers:,}",
            f"{self.register_s:.1f}",
            ms(self.list_floor.p50_ms),
            f"{self.ready_s:.2f}",
            f"{self.rss_mb:.0f}",
            listed,
            ms(self.propagation.p50_ms),
            ms(self.propagation.p99_ms),
            *(ms(self.request[share].p50_ms) for share in REQUIRED),
            *(f"{self.decision_us[share]:.0f}" for share in REQUIRED),
        ]

    def json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "workers": self.workers,
            "register_s": self.register_s,
            "list_floor": stats_json(self.list_floor),
            "ready_s": self.ready_s,
            "rss_mb": self.rss_mb,
            "list_workers": stats_json(self.list_workers),
            "list_workers_raw_channel": self.list_raw,
            "list_workers_client_error": self.list_error,
            "propagation": stats_json(self.propagation),
            "propagation_ms": [n / 1e6 for n in self.propagation_ns],
            "request": {share: stats_json(s) for share, s in self.request.items()},
            "decision_mean_us": self.decision_us,
        }


HEADERS = (
    "backend", "workers", "register s", "list floor ms", "ready s", "RSS MB",
    "ListWorkers ms", "propagation p50", "p99", "request p50 (1/2)", "(1/20)",
    "decision µs (1/2)", "(1/20)",
)  # fmt: skip


@dataclass(frozen=True)
class Config:
    updates: int
    requests: int
    list_repeat: int


async def list_workers(socket: Path, repeat: int) -> tuple[Stats, bool, str]:
    """ListWorkers through the product's client; through a raw channel if it refuses."""
    async with AsyncClient(f"unix://{socket}", timeout=120) as client:
        try:
            return await timed(lambda: client.list_workers(model=MODEL), repeat), False, ""
        except DynamoError as exc:
            error = str(exc)
    options = [("grpc.max_receive_message_length", RAW_RECEIVE_LIMIT)]
    async with grpc.aio.insecure_channel(f"unix://{socket}", options=options) as channel:
        stub = rpc.WorkerServiceStub(channel)
        request = pb.ListWorkersRequest(model=MODEL)
        return await timed(lambda: stub.ListWorkers(request, timeout=120), repeat), True, error


async def propagation(store: Store, socket: Path, probes: list[str], rounds: int) -> list[int]:
    """ns from ``update_taints`` returning to the daemon's event stream carrying it. The
    stream is ``events tail -l bench/probe``: the whole fleet's snapshot would not fit the
    client's 4 MB receive limit at 10,000 workers."""
    samples = []
    async with (
        AsyncClient(f"unix://{socket}", timeout=60) as client,
        contextlib.aclosing(client.tail_events(selector=PROBE)) as events,
    ):
        await anext(events)  # the snapshot
        for index in range(rounds):
            which = index % len(probes)
            op = TaintUpdate.replace([*fleet_taints(which), f"bench/round={index}"])
            key = probes[which]
            revision = (await update_taints(store, key, op)).revision
            returned = time.monotonic_ns()
            async with asyncio.timeout(30):
                while (await anext(events)).revision < revision:
                    pass
            samples.append(time.monotonic_ns() - returned)
    return samples


async def decision_seconds(http: aiohttp.ClientSession, front: str) -> tuple[float, float]:
    """(sum, count) of the daemon's routing decision histogram."""
    async with http.get(front + "/metrics") as reply:
        text = await reply.text()
    values = {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("dynamod_router_decision_seconds_")
    }
    return values["dynamod_router_decision_seconds_sum"], values[
        "dynamod_router_decision_seconds_count"
    ]


async def routing(front: str, required: list[str], requests: int) -> tuple[Stats, float]:
    """Request latency and the daemon's mean decision time (µs) over ``requests``."""
    async with aiohttp.ClientSession() as http:

        async def one() -> None:
            async with http.post(front + "/v1/completions", json=body(required)) as reply:
                await reply.read()
                if reply.status != 200:
                    raise RuntimeError(f"a routed request got {reply.status}")

        for _ in range(10):
            await one()  # warm-up: connections, caches
        total0, count0 = await decision_seconds(http, front)
        stats = await timed(one, requests)
        total1, count1 = await decision_seconds(http, front)
    return stats, (total1 - total0) / max(count1 - count0, 1) * 1e6


async def measure_point(
    backend: str, url: str, size: int, mocker: str, scratch: Path, cfg: Config
) -> Point:
    async with await open_store(url) as store:
        started = time.perf_counter()
        probes = await register_fleet(store, size, mocker)
        register_s = time.perf_counter() - started
        list_floor = await timed(lambda: store.list(WORKERS_PREFIX), 3)
        socket = scratch / f"{backend}-{size}.sock"
        proc = daemon(url, socket)
        started = time.perf_counter()
        async with running(proc):
            ready_s = time.perf_counter() - started
            rss_mb = psutil.Process(proc.pid).memory_info().rss / 2**20
            listed, raw, error = await list_workers(socket, cfg.list_repeat)
            samples = await propagation(store, socket, probes, cfg.updates)
            routed = {
                share: await routing(proc.field("http"), required, cfg.requests)
                for share, required in REQUIRED.items()
            }
    return Point(
        backend, size, register_s, list_floor, ready_s, rss_mb, listed, raw, error,
        Stats.of(samples), samples, {k: v[0] for k, v in routed.items()},
        {k: v[1] for k, v in routed.items()},
    )  # fmt: skip


def place_url(backend: str, endpoint: str, size: int) -> str:
    """A fresh prefix (etcd) or bucket (NATS) per fleet size."""
    if backend == "etcd":
        return f"etcd://{endpoint}/scale-{size}"
    return f"{endpoint}/scale{size}"


@contextlib.asynccontextmanager
async def mocker(scratch: Path) -> AsyncIterator[str]:
    """One real mocker worker (registered in a scratch file store); its HTTP address."""
    proc: Proc = worker((scratch / "mocker-store").as_uri(), "--speedup-ratio", "1000", model=MODEL)
    async with running(proc):
        yield proc.field("http")


async def measure(
    backends: Sequence[str], sizes: Sequence[int], cfg: Config, endpoints: dict[str, str],
    scratch: Path,
) -> list[Point]:  # fmt: skip
    points = []
    async with mocker(scratch) as address:
        for backend in backends:
            for size in sizes:
                url = place_url(backend, endpoints[backend], size)
                points.append(await measure_point(backend, url, size, address, scratch, cfg))
                print(f"  measured {backend} with {size:,} workers", file=sys.stderr)
    return points


def sizes_for(workers: int) -> list[int]:
    return sorted({BASELINE, max(workers // 10, BASELINE), workers})


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    parser.add_argument("--workers", type=int, default=10_000, help="the largest fleet")
    parser.add_argument("--backends", nargs="+", choices=SERVER_BACKENDS, default=["etcd", "nats"])
    parser.add_argument("--updates", type=int, default=100, help="propagation rounds")
    parser.add_argument("--requests", type=int, default=200, help="routed requests")
    parser.add_argument("--list-repeat", type=int, default=5, help="ListWorkers calls")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    for name in ("workers", "updates", "requests", "list_repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def run(args: argparse.Namespace) -> int:
    found = versions()
    sizes = sizes_for(args.workers)
    cfg = Config(args.updates, args.requests, args.list_repeat)
    detail = (
        f"fleets of {', '.join(f'{s:,}' for s in sizes)} registered workers, "
        f"{cfg.updates} propagation rounds, {cfg.requests} routed requests"
    )
    print(header("dynamod at scale", found, detail))
    with places(args.backends, bucket="scale") as where:
        endpoints = {
            "etcd": where.etcd_endpoint or "",
            "nats": where.nats_address or "",
        }
        points = asyncio.run(measure(args.backends, sizes, cfg, endpoints, where.scratch))
    print(render_table(HEADERS, [p.cells() for p in points]))
    for point in points:
        if point.list_error:
            print(f"note: {point.backend} {point.workers:,}: the client said: {point.list_error}")
    write_json(
        args.json,
        {
            "benchmark": "scale",
            "versions": found,
            "sizes": sizes,
            "config": vars(cfg),
            "rows": [p.json() for p in points],
        },
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return interruptible(lambda: run(parse(argv)))


if __name__ == "__main__":
    sys.exit(main())
