"""dynamod with a large fleet: start-up, memory, listing, propagation and routing.

    python -m bench.scale                              # etcd and nats, 10, 1,000 and 10,000
    python -m bench.scale --workers 2000 --backends etcd --json out.json

The fleet is *registrations*, not processes: this process writes ``--workers`` worker
records under one long lease (no keep-alive traffic during the run), each with a capacity,
a pool and a zone taint (20 combinations: the router sees 20 taint groups, however large
the fleet), all pointing at one real mocker worker (``dynamo-worker``, fast speed-up ratio)
so that routed requests get a real answer. Every backend is measured at three fleet sizes,
``1`` (the baseline: one worker, as a fleet of one real mocker), ``--workers / 10`` and
``--workers``, each in a fresh key prefix (etcd) or bucket (NATS), with a fresh
``dynamod``:

* ``ready s``: from spawning ``dynamod`` to its readiness line (store opened, first
  snapshot applied, sockets bound); the floor is a bare ``Store.list`` of the prefix from
  this process (``list floor ms``);
* ``RSS MB``: the daemon's resident memory once ready (``psutil``), and ``after`` the
  listings below (each worker's message is then kept, ``convert.WorkerMessages``);
* ``ListWorkers in dynamod``: the daemon's own time per call (its
  ``dynamod_api_listing_seconds`` histogram: selecting the workers and writing the
  answer), every field, after one call has encoded each worker; ``+ wire``: p50 of the
  same call timed here on a raw channel that leaves the answer as bytes (the daemon,
  gRPC and the unix socket, no decoding); ``table``: that with the fields ``dynamoctl
  workers ls`` asks for; ``client``: the whole call through ``dynamod.client`` (every
  worker decoded into a record); ``first page``: ``StreamWorkers`` (what ``workers ls``
  uses) until its first page is decoded;
* ``propagation``: from ``update_taints`` returning in this process to the change
  arriving on an ``events tail`` stream of the daemon (p50 / p99 of ``--updates``), for
  64 probe workers spread over the rounds (the stream selects them by a taint);
* ``request``: a real completion through the front, p50, requiring nothing (every worker
  eligible), ``capacity/fast`` (half the fleet) or three taints (a twentieth), two
  preferred taints scored; ``x 1`` is the every-worker p50 over the one-worker row's of
  the same backend; ``decision``: the daemon's mean routing decision time over the same
  requests, from its ``dynamod_router_decision_seconds`` histogram.

All sizes of a backend run side by side, each with its own dynamod: the listings and the
propagation rounds are measured one size at a time, the requests round-robin over the
sizes. Compare each row with the baseline row of its backend: that is the cost of the
fleet.
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
from dynamod.client import AsyncClient
from dynamod.discovery.registration import register
from dynamod.discovery.updates import update_taints
from dynamod.records import WORKERS_PREFIX
from dynamod.store import Lease, Store, open_store
from dynamod.taints import TaintUpdate
from tests.support.factories import make_record
from tests.support.processes import Proc, daemon, running, worker

MODEL = "scale"
BASELINE = 1
LEASE_TTL = 3600.0  # outlives the run: no keep-alive traffic to measure around
REGISTER_CONCURRENCY = 128
RAW_RECEIVE_LIMIT = 256 * 2**20
PREFERRED = {"pool=p1": 0.5, "zone=z3": -0.3}
REQUIRED = {
    "all": [],  # every worker eligible
    "1/2": ["capacity/fast"],  # half the fleet eligible
    "1/20": ["capacity/fast", "pool=p1", "zone=z1"],  # a twentieth (index 1 mod 20)
}
TABLE_FIELDS = ["id", "model", "address", "taints", "load", "started_at"]


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


def served(size: int, required: list[str]) -> bool:
    """Whether a fleet of ``size`` has a worker with every taint in ``required`` (the
    one-worker baseline serves only the requests that require nothing)."""
    return any(set(required) <= set(fleet_taints(i)) for i in range(min(size, 20)))


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
class Listing:
    """ListWorkers and StreamWorkers at one fleet size (see the module docstring)."""

    raw: Stats
    in_daemon_ms: float  # the mean of the daemon's own listing histogram over ``raw``
    table: Stats
    client: Stats
    first_page: Stats

    def json(self) -> dict[str, Any]:
        return {k: v if isinstance(v, float) else stats_json(v) for k, v in vars(self).items()}


@dataclass
class Point:
    backend: str
    workers: int
    register_s: float
    list_floor: Stats
    ready_s: float
    rss_mb: float
    rss_after_mb: float
    listing: Listing
    propagation: Stats
    propagation_ns: list[int]
    request: dict[str, Stats]  # by the share of the fleet the request's taints select
    # (only those the fleet can serve: the one-worker baseline serves "all" only)
    decision_us: dict[str, float]
    baseline_all_ms: float  # the every-worker request p50 of this backend's baseline row

    def cells(self) -> list[str]:
        return [
            self.backend,
            f"{self.workers:,}",
            f"{self.register_s:.1f}",
            ms(self.list_floor.p50_ms),
            f"{self.ready_s:.2f}",
            f"{self.rss_mb:.0f}",
            f"{self.rss_after_mb:.0f}",
            ms(self.listing.in_daemon_ms),
            ms(self.listing.raw.p50_ms),
            ms(self.listing.table.p50_ms),
            ms(self.listing.client.p50_ms),
            ms(self.listing.first_page.p50_ms),
            ms(self.propagation.p50_ms),
            ms(self.propagation.p99_ms),
            *(ms(self.request[s].p50_ms) if s in self.request else "—" for s in REQUIRED),
            f"{self.request['all'].p50_ms / self.baseline_all_ms:.2f}",
            *(f"{self.decision_us[s]:.0f}" if s in self.request else "—" for s in REQUIRED),
        ]

    def json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "workers": self.workers,
            "register_s": self.register_s,
            "list_floor": stats_json(self.list_floor),
            "ready_s": self.ready_s,
            "rss_mb": self.rss_mb,
            "rss_after_listing_mb": self.rss_after_mb,
            # ``list_workers``: the daemon's side (raw bytes), as the report reads it
            "list_workers": stats_json(self.listing.raw),
            "list_workers_in_daemon_ms": self.listing.in_daemon_ms,
            "list_workers_raw_channel": False,
            "list_workers_client_error": "",
            "listing": self.listing.json(),
            "propagation": stats_json(self.propagation),
            "propagation_ms": [n / 1e6 for n in self.propagation_ns],
            "request": {share: stats_json(s) for share, s in self.request.items()},
            "request_all_over_baseline": self.request["all"].p50_ms / self.baseline_all_ms,
            "decision_mean_us": self.decision_us,
        }


HEADERS = (
    "backend", "workers", "register s", "list floor ms", "ready s", "RSS MB", "after",
    "ListWorkers in dynamod ms", "+ wire", "table", "client", "first page",
    "propagation p50", "p99",
    "request p50 (all)", "(1/2)", "(1/20)", "x 1", "decision µs (all)", "(1/2)", "(1/20)",
)  # fmt: skip


@dataclass(frozen=True)
class Config:
    updates: int
    requests: int
    list_repeat: int


async def listing(socket: Path, front: str, repeat: int) -> Listing:
    """The listing columns; see the module docstring."""
    request = pb.ListWorkersRequest(model=MODEL)
    table = pb.ListWorkersRequest(model=MODEL, fields=TABLE_FIELDS)
    options = [("grpc.max_receive_message_length", RAW_RECEIVE_LIMIT)]
    async with (
        aiohttp.ClientSession() as http,
        grpc.aio.insecure_channel(f"unix://{socket}", options=options) as channel,
    ):
        raw: grpc.aio.UnaryUnaryMultiCallable[pb.ListWorkersRequest, bytes] = channel.unary_unary(
            "/dynamo.v1.WorkerService/ListWorkers",
            request_serializer=pb.ListWorkersRequest.SerializeToString,
            response_deserializer=None,  # bytes: no decoding on this side
        )
        await raw(request, timeout=120)  # each worker's encoding is kept from here on
        before = await histogram(http, front, LISTING, method="ListWorkers")
        whole = await timed(lambda: raw(request, timeout=120), repeat)
        in_daemon = mean_us(before, await histogram(http, front, LISTING, method="ListWorkers"))
        fields = await timed(lambda: raw(table, timeout=120), repeat)
    async with AsyncClient(f"unix://{socket}", timeout=120) as client:
        decoded = await timed(lambda: client.list_workers(model=MODEL), repeat)

        async def first_page() -> None:
            pages = client.stream_workers(model=MODEL, fields=TABLE_FIELDS)
            async with contextlib.aclosing(pages):
                await anext(pages)

        first = await timed(first_page, repeat)
    return Listing(whole, in_daemon / 1000, fields, decoded, first)


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


async def histogram(
    http: aiohttp.ClientSession, front: str, name: str, **labels: str
) -> tuple[float, float]:
    """(sum, count) of one of the daemon's histograms, from its /metrics."""
    async with http.get(front + "/metrics") as reply:
        text = await reply.text()
    values = {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(name) and all(s.labels.get(k) == v for k, v in labels.items())
    }
    return values.get(f"{name}_sum", 0.0), values.get(f"{name}_count", 0.0)


def mean_us(before: tuple[float, float], after: tuple[float, float]) -> float:
    return (after[0] - before[0]) / max(after[1] - before[1], 1) * 1e6


DECISION = "dynamod_router_decision_seconds"
LISTING = "dynamod_api_listing_seconds"


async def routing(
    fronts: dict[int, str], required: list[str], requests: int
) -> dict[int, tuple[Stats, float]]:
    """Request latency and the daemon's mean decision time (µs), per fleet size, over
    ``requests`` rounds of one request to every front: the sizes take turns, so load from
    elsewhere falls on all of them alike and their ratio holds."""
    async with aiohttp.ClientSession() as http:

        async def one(front: str) -> int:
            started = time.perf_counter_ns()
            async with http.post(front + "/v1/completions", json=body(required)) as reply:
                await reply.read()
                if reply.status != 200:
                    raise RuntimeError(f"a routed request got {reply.status}")
            return time.perf_counter_ns() - started

        for front in fronts.values():
            for _ in range(10):
                await one(front)  # warm-up: connections, caches
        before = {n: await histogram(http, f, DECISION) for n, f in fronts.items()}
        samples: dict[int, list[int]] = {n: [] for n in fronts}
        for _ in range(requests):
            for size, front in fronts.items():
                samples[size].append(await one(front))
        after = {n: await histogram(http, f, DECISION) for n, f in fronts.items()}
    return {n: (Stats.of(samples[n]), mean_us(before[n], after[n])) for n in fronts}


@dataclass
class Started:
    """One fleet size of a backend, registered, with its dynamod running."""

    size: int
    store: Store
    probes: list[str]
    register_s: float
    list_floor: Stats
    socket: Path
    proc: Proc
    ready_s: float


async def start(
    stack: contextlib.AsyncExitStack, backend: str, url: str, size: int, mocker: str,
    scratch: Path,
) -> Started:  # fmt: skip
    store = await stack.enter_async_context(await open_store(url))
    started = time.perf_counter()
    probes = await register_fleet(store, size, mocker)
    register_s = time.perf_counter() - started
    list_floor = await timed(lambda: store.list(WORKERS_PREFIX), 3)
    socket = scratch / f"{backend}-{size}.sock"
    proc = daemon(url, socket)
    started = time.perf_counter()
    await stack.enter_async_context(running(proc))
    ready_s = time.perf_counter() - started
    return Started(size, store, probes, register_s, list_floor, socket, proc, ready_s)


async def measure_backend(
    backend: str, endpoint: str, sizes: Sequence[int], mocker: str, scratch: Path, cfg: Config
) -> list[Point]:
    """Every size of one backend, their dynamods all running: each is listed and updated
    on its own, then requests go round-robin to all of them."""
    async with contextlib.AsyncExitStack() as stack:
        fleets = [
            await start(stack, backend, place_url(backend, endpoint, size), size, mocker, scratch)
            for size in sizes
        ]
        measured: dict[int, tuple[float, float, Listing, list[int]]] = {}
        for f in fleets:
            rss_mb = psutil.Process(f.proc.pid).memory_info().rss / 2**20
            listed = await listing(f.socket, f.proc.field("http"), cfg.list_repeat)
            rss_after_mb = psutil.Process(f.proc.pid).memory_info().rss / 2**20
            samples = await propagation(f.store, f.socket, f.probes, cfg.updates)
            measured[f.size] = (rss_mb, rss_after_mb, listed, samples)
        routed: dict[int, dict[str, tuple[Stats, float]]] = {f.size: {} for f in fleets}
        for share, required in REQUIRED.items():
            fronts = {f.size: f.proc.field("http") for f in fleets if served(f.size, required)}
            for size, result in (await routing(fronts, required, cfg.requests)).items():
                routed[size][share] = result
    baseline = routed[fleets[0].size]["all"][0].p50_ms
    return [point(backend, f, measured[f.size], routed[f.size], baseline) for f in fleets]


def point(
    backend: str,
    fleet: Started,
    measured: tuple[float, float, Listing, list[int]],
    routed: dict[str, tuple[Stats, float]],
    baseline_ms: float,
) -> Point:
    rss_mb, rss_after_mb, listed, samples = measured
    return Point(
        backend, fleet.size, fleet.register_s, fleet.list_floor, fleet.ready_s, rss_mb,
        rss_after_mb, listed, Stats.of(samples), samples, {k: v[0] for k, v in routed.items()},
        {k: v[1] for k, v in routed.items()}, baseline_ms,
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
            points += await measure_backend(
                backend, endpoints[backend], sizes, address, scratch, cfg
            )
            print(f"  measured {backend}", file=sys.stderr)
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
