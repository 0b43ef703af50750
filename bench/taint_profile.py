"""Where a worker's taint update spends its time, from the POST to a router routing on it.

    python -m bench.taint_profile                  # 300 timed updates, then 300 profiled
    python -m bench.taint_profile --updates 1000 --json out.json

One etcd. In this process, wired as ``dynamo-worker`` wires them (``worker/runtime.py``): a
``Registration`` of one worker record, its ``WorkerTaintWriter`` auditing to a file, and
its ``SystemServer`` served on loopback with the worker's HTTP limits. Beside it, on a
second store connection (as a daemon has its own), a ``WorkerView`` feeding a ``Router``,
with one request parked in the router for the taint each update sets.

Each update is ``POST /engine/update/model_taints`` with a value never used before, timed
on one clock (``perf_counter_ns``) at each step:

* *parse and validate*: the handler entered → the writer called (body read, JSON, the
  caller, ``TaintUpdate.replace``);
* *compute*: the writer called → the compare-and-swap sent (the lock, the new record, its
  bytes);
* *compare-and-swap*: the store's ``put`` at the expected revision, the wait for etcd;
* *audit*: the audit line written and flushed;
* *answer*: the audit written → the handler returned (the JSON answer);
* *aiohttp and the client*: what is left of the client's call (request parsed, answer
  written and read);
* *the watch*: the put's return → the event in the view (etcd's watch, decoding, the
  translator's fast path);
* *the router*: the view's event → ``Router.apply`` done (re-index, waiting re-checked);
* *the wake*: ``Router.apply`` done → the parked request running on the worker.

A second pass runs the same updates under ``cProfile`` and reports CPU time per update in
the worker's parts (a coroutine counts only while it runs, never while it awaits the
store), to compare their shares.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import platform
import pstats
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from bench.common import Stats, header, interruptible, owned, render_table, write_json
from dynamod.audit import AuditLog
from dynamod.discovery.registration import Registration, new_instance_id
from dynamod.discovery.view import WorkerView
from dynamod.discovery_events import WorkerModified
from dynamod.http.limits import HttpLimits
from dynamod.http.server import listen, serve_app
from dynamod.lifecycle import server_loop
from dynamod.records import ModelCard, WorkerRecord
from dynamod.router import Router, RouteRequest, RouterKnobs
from dynamod.store import Store, open_store
from dynamod.taints import RoutingConstraints
from dynamod.worker.system import SystemServer, refusal
from dynamod.worker.writer import WorkerTaintWriter
from tests.support.servers import EtcdServer

WARMUP = 30
MODEL = "bench"
STEPS = (
    ("parse and validate", "entered", "applying"),
    ("compute (lock, record, bytes)", "applying", "put_sent"),
    ("compare-and-swap (etcd)", "put_sent", "put_done"),
    ("audit line", "audit_sent", "audit_done"),
    ("answer (JSON)", "audit_done", "returned"),
    ("aiohttp and the client", None, None),
    ("= the POST, client side", "posted", "answered"),
    ("the watch (etcd → view event)", "put_done", "event"),
    ("the router (Router.apply)", "event", "applied"),
    ("the wake (parked request runs)", "applied", "woken"),
    ("= put returned → routed", "put_done", "woken"),
    ("= POST answered → routed", "answered", "woken"),
)
PARTS: tuple[tuple[str, str, str], ...] = (
    ("the route's handler (all of it)", "worker/system.py", "_update_taints"),
    ("the writer (lock, compute, put, audit)", "worker/writer.py", "apply"),
    ("update_taints (compute, put)", "discovery/updates.py", "update_taints"),
    ("the store's put (client CPU)", "store/etcd/store.py", "put"),
    ("the audit line", "dynamod/audit.py", "record"),
    ("the answer (json_response)", "aiohttp/web_response.py", "json_response"),
    ("the view's event (translate)", "discovery/translate.py", "translate"),
    ("Router.apply", "router/router.py", "apply"),
)
SERVER = ("aiohttp/web_protocol.py", "_handle_request")


@dataclass
class Marks:
    """One update's stamps, in ns of ``perf_counter_ns``."""

    at: dict[str, int] = field(default_factory=dict)

    def mark(self, name: str) -> None:
        self.at.setdefault(name, time.perf_counter_ns())


class Stamper:
    """Where the stamps come from: the worker's store, audit and writer, and the view."""

    def __init__(self) -> None:
        self.current = Marks()
        self.reads = 0

    def counted(self, call: Callable[..., Awaitable[Any]]) -> Any:
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.reads += 1
            return await call(*args, **kwargs)

        return wrapper

    def timed(self, before: str, after: str, call: Callable[..., Awaitable[Any]]) -> Any:
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.current.mark(before)
            try:
                return await call(*args, **kwargs)
            finally:
                self.current.mark(after)

        return wrapper

    def timed_sync(self, before: str, after: str, call: Callable[..., Any]) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.current.mark(before)
            try:
                return call(*args, **kwargs)
            finally:
                self.current.mark(after)

        return wrapper

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        self.current.mark("entered")
        try:
            return await handler(request)
        finally:
            self.current.mark("returned")

    def seen(self, key: str) -> Callable[[object], None]:
        def listener(event: object) -> None:
            if isinstance(event, WorkerModified) and event.record.key == key:
                self.current.mark("event")

        return listener

    def routed(self, key: str) -> Callable[[object], None]:
        def listener(event: object) -> None:
            if isinstance(event, WorkerModified) and event.record.key == key:
                self.current.mark("applied")

        return listener


@contextlib.asynccontextmanager
async def worker_side(
    store: Store, stamper: Stamper, audit_path: Path
) -> AsyncIterator[tuple[str, WorkerRecord]]:
    """The worker's registration, writer and system server; yields the route and record."""
    record = WorkerRecord(
        instance_id=new_instance_id(),
        namespace="bench",
        component="backend",
        endpoint="generate",
        address="http://127.0.0.1:9",
        model_card=ModelCard(name=MODEL),
    )
    audit = AuditLog(audit_path)
    audit.open()
    audit.record = stamper.timed_sync("audit_sent", "audit_done", audit.record)  # type: ignore[method-assign]
    store.put = stamper.timed("put_sent", "put_done", store.put)  # type: ignore[method-assign]
    store.get = stamper.counted(store.get)  # type: ignore[method-assign]
    writer = WorkerTaintWriter(audit)
    writer.apply = stamper.timed("applying", "applied_writer", writer.apply)  # type: ignore[method-assign]
    system = SystemServer(tokens=None, registry=CollectorRegistry(), writer=writer)
    app = system.app()
    app.middlewares.append(stamper.middleware)
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(audit.close)
        sock = listen("127.0.0.1", 0, "system http")
        stack.callback(sock.close)
        host, port = await serve_app(stack, app, sock, refusal, HttpLimits())
        registration = await stack.enter_async_context(Registration(store, record))
        writer.running(registration)
        yield f"http://{host}:{port}/engine/update/model_taints", registration.record


async def parked(router: Router, taint: str, stamper: Stamper, ready: asyncio.Event) -> None:
    """A request that needs ``taint``, waiting in the router until a worker has it."""
    constraints = RoutingConstraints(required_taints=frozenset({taint}))
    ready.set()
    async with router.route(RouteRequest(MODEL, constraints, max_wait=10.0)):
        stamper.current.mark("woken")


async def one_update(
    http: aiohttp.ClientSession, url: str, router: Router, stamper: Stamper, taint: str
) -> Marks:
    stamper.current = marks = Marks()
    ready = asyncio.Event()
    waiter = asyncio.create_task(parked(router, taint, stamper, ready))
    await ready.wait()
    await asyncio.sleep(0)  # the request is parked in the router before the POST
    marks.mark("posted")
    async with http.post(url, json={"taints": [taint]}) as response:
        await response.read()
    marks.mark("answered")
    if response.status != 200:
        raise RuntimeError(f"the taint route answered {response.status}")
    await asyncio.wait_for(waiter, 10.0)
    return marks


async def burst(http: aiohttp.ClientSession, url: str, n: int) -> list[int]:
    """``n`` updates back to back, each POSTed as soon as the last answered: no time for
    the worker's own watch to see its last write before the next."""
    took = []
    for i in range(n):
        started = time.perf_counter_ns()
        async with http.post(url, json={"taints": [f"burst/{i}"]}) as response:
            await response.read()
        took.append(time.perf_counter_ns() - started)
        if response.status != 200:
            raise RuntimeError(f"the taint route answered {response.status}")
    return took


@dataclass
class Measured:
    samples: list[Marks]
    reads: int
    burst: list[int]
    burst_reads: int
    stats: pstats.Stats | None


async def measure(url: str, n: int, profile: bool) -> Measured:
    mine, theirs = await open_store(url), await open_store(url)
    stamper = Stamper()
    router = Router(RouterKnobs(), registry=CollectorRegistry())
    view = WorkerView(theirs)
    try:
        with tempfile.TemporaryDirectory(prefix="dynamod-taint-profile-") as tmp:
            async with (
                worker_side(mine, stamper, Path(tmp) / "audit.log") as (route, record),
                aiohttp.ClientSession() as http,
            ):
                view.listen(stamper.seen(record.key))
                view.listen(router.apply)
                view.listen(stamper.routed(record.key))
                async with owned(view.run(), "worker view"):
                    await view.wait_for(lambda v: v.get(record.key) is not None)
                    for i in range(WARMUP):
                        await one_update(http, route, router, stamper, f"warm/{i}")
                    stamper.reads = 0
                    samples = [
                        await one_update(http, route, router, stamper, f"timed/{i}")
                        for i in range(n)
                    ]
                    reads, stamper.reads = stamper.reads, 0
                    burst_took = await burst(http, route, n)
                    burst_reads = stamper.reads
                    stats = None
                    if profile:
                        profiler = cProfile.Profile()
                        profiler.enable()
                        for i in range(n):
                            await one_update(http, route, router, stamper, f"profiled/{i}")
                        profiler.disable()
                        stats = pstats.Stats(profiler)
                    return Measured(samples, reads, burst_took, burst_reads, stats)
    finally:
        await mine.aclose()
        await theirs.aclose()


def step_rows(samples: list[Marks]) -> tuple[list[list[str]], dict[str, Any]]:
    rows, found = [], {}
    for label, start, end in STEPS:
        if start is None or end is None:
            values = [
                (m.at["answered"] - m.at["posted"]) - (m.at["returned"] - m.at["entered"])
                for m in samples
            ]
        else:
            values = [m.at[end] - m.at[start] for m in samples]
        stats = Stats.of([max(v, 0) for v in values])
        rows.append([label, f"{stats.p50_ms:.3f}", f"{stats.p99_ms:.3f}"])
        found[label] = {"p50_ms": stats.p50_ms, "p99_ms": stats.p99_ms}
    return rows, found


def _cumulative(stats: pstats.Stats, where: str, name: str) -> float:
    table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    return sum(
        float(row[3])
        for (path, _line, func), row in table.items()
        if func == name and path.endswith(where)
    )


def cpu_rows(stats: pstats.Stats, n: int) -> tuple[list[list[str]], dict[str, float]]:
    server = _cumulative(stats, *SERVER)
    rows, found = [], {}
    for label, where, name in PARTS:
        us = _cumulative(stats, where, name) / n * 1e6
        found[label] = us
        rows.append([label, f"{us:.0f}"])
    found["aiohttp server (request handling, whole)"] = server / n * 1e6
    rows.append(["aiohttp server (request handling, whole)", f"{server / n * 1e6:.0f}"])
    return rows, found


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.taint_profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--updates", type=int, default=300, help="updates timed (and profiled)")
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile pass")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.updates < 1:
        parser.error(f"--updates {args.updates} must be at least 1")
    return args


def _measure_on_server_loop(url: str, args: argparse.Namespace) -> Measured:
    """On the servers' own loop (uvloop unless ``DYNAMO_EVENT_LOOP`` says otherwise)."""
    loop = server_loop()
    try:
        return loop.run_until_complete(measure(url, args.updates, not args.no_profile))
    finally:
        loop.close()


def run(args: argparse.Namespace) -> int:
    found = {"python": platform.python_version(), "aiohttp": aiohttp.__version__}
    detail = f"{args.updates} taint updates after {WARMUP} warm-up, one worker, one etcd"
    print(header("taint route profile", found, detail))
    with tempfile.TemporaryDirectory(prefix="dynamod-bench-") as tmp:
        etcd = EtcdServer(Path(tmp) / "etcd")
        with etcd:
            measured = _measure_on_server_loop(etcd.url("bench"), args)
    rows, steps = step_rows(measured.samples)
    took = Stats.of(measured.burst)
    rows.append(["back to back: the POST, client side", f"{took.p50_ms:.3f}", f"{took.p99_ms:.3f}"])
    print(render_table(("step", "p50 ms", "p99 ms"), rows))
    spaced, back_to_back = measured.reads / args.updates, measured.burst_reads / args.updates
    print(f"store reads (get) per update: {spaced:.2f} spaced, {back_to_back:.2f} back to back")
    document: dict[str, Any] = {
        "benchmark": "taint_profile",
        "updates": args.updates,
        "steps": steps,
        "reads": measured.reads,
        "burst_reads": measured.burst_reads,
        "burst_p50_ms": took.p50_ms,
        "burst_p99_ms": took.p99_ms,
    }
    if measured.stats is not None:
        cpu, parts = cpu_rows(measured.stats, args.updates)
        print(render_table(("part (profiled, CPU)", "µs / update"), cpu))
        document["cpu_us"] = parts
    write_json(args.json, document)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return interruptible(lambda: run(parse(argv)))


if __name__ == "__main__":
    sys.exit(main())
