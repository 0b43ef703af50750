"""Taint propagation: ``update_taints`` returning → the change visible in another process.

    python -m bench.propagation                  # file, etcd, nats + memory, 300 updates each
    python -m bench.propagation --updates 1000 --backends etcd --json out.json

Per backend, this process registers one worker and spawns an *observer* process
(``python -m bench.propagation --child URL``) that runs a ``WorkerView`` over the same
store, as a router would. Each round:

1. ``update_taints`` replaces the worker's taints; the clock starts when it *returns*;
   the observer's view listener stamps the ``WorkerModified`` of that revision;
2. the floor: a plain ``Store.put`` of another key, the clock starting when it returns; the
   observer's bare ``Store.watch`` on that key stamps its ``Put``.

So the difference between the two is what discovery adds on top of the store (the
read-modify-CAS of ``update_taints`` is not in it: that is the update call's own duration,
shown separately). ``bench.store_latency`` measures the store against its client library.

Timing across processes: both sides read ``time.monotonic_ns()``, which is
``CLOCK_MONOTONIC``, one clock for the whole machine on Linux. The observer writes one line
per sighting (``kind revision ns``) to its stdout pipe and the parent waits for it before
the next round, so rounds never overlap. The JSON also holds the same latencies taken
when the line reached the parent (the pipe handshake, no clock sharing, ~50 µs more).
A value below zero would mean the observer saw the change before the writer's call
returned, which the store's watch may legally do. So the table also times each sighting
from the moment the call *started* (``end_to_end``): what an operator waits between issuing
the update and a router in another process seeing it, always positive.

The memory store cannot be shared between processes: its row runs the observer in this
process, as a reference.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

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
    versions,
    write_json,
)
from dynamod.discovery.registration import register
from dynamod.discovery.updates import update_taints
from dynamod.discovery.view import WorkerView
from dynamod.discovery_events import DiscoveryEvent, WorkerModified
from dynamod.store import Put, Resync, Store, keep_alive, open_store
from dynamod.taints import TaintUpdate
from dynamod.tasks import race
from tests.support.factories import make_record

BACKENDS = ("memory", "file", "etcd", "nats")
ROOT = Path(__file__).resolve().parents[1]
FLOOR_KEY = "bench/floor"
FLOOR_BYTES = 512  # about the size of a worker record, like the record itself
WARMUP = 30
LEASE_TTL = 30.0
START_TIMEOUT = 30.0
SIGHT_TIMEOUT = 10.0

Emit = Callable[[str, int], None]
"""``emit(kind, revision)``: the observer saw ``kind`` ("view" or "floor") at that revision."""


# -- the observer: what a router process sees ------------------------------------------------


class Observer:
    """A ``WorkerView`` over the store plus a bare watch on ``FLOOR_KEY``; each sighting is
    reported through ``emit`` the moment it happens (in the view's listener, or as the
    watch yields the event)."""

    def __init__(self, store: Store, emit: Emit) -> None:
        self.store = store
        self.emit = emit

    async def run(self) -> None:
        """Report ``ready`` once both are synced, then every sighting, until cancelled."""
        view = WorkerView(self.store)
        view.listen(self._on_view_event)
        async with self.store.watch(FLOOR_KEY) as watch, asyncio.TaskGroup() as tasks:
            tasks.create_task(view.run(), name="observer worker view")
            async with asyncio.timeout(START_TIMEOUT):
                first = await anext(watch)
                await view.ready.wait()
            if not isinstance(first, Resync):
                raise RuntimeError(f"the floor watch began with {first!r}, not a Resync")
            self.emit("ready", 0)
            async for event in watch:
                if isinstance(event, Put):
                    self.emit("floor", event.revision)

    def _on_view_event(self, event: DiscoveryEvent) -> None:
        if isinstance(event, WorkerModified):
            self.emit("view", event.revision)


def emit_line(kind: str, revision: int) -> None:
    """The child's report: stamp first, then one line on the pipe."""
    now = time.monotonic_ns()
    sys.stdout.write(f"{kind} {revision} {now}\n")
    sys.stdout.flush()


async def stdin_closed() -> None:
    """Return when the parent closes our stdin: its way of ending the observer."""
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
    )
    try:
        await reader.read()
    finally:
        transport.close()


async def observe(url: str) -> int:
    async with await open_store(url) as store:
        await race(Observer(store, emit_line).run(), stdin_closed())
    return 0


def child_main(url: str) -> int:
    # Ctrl-C reaches the whole process group; the parent decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return asyncio.run(observe(url))


# -- the parent's side of an observer ----------------------------------------------------------


@dataclass(frozen=True)
class Sighting:
    kind: str
    revision: int
    seen_ns: int  # when the observer saw it
    received_ns: int  # when this process learned of it


class Sightings(Protocol):
    async def next(self) -> Sighting: ...


async def expect(sightings: Sightings, kind: str, revision: int) -> Sighting:
    """The next sighting, which must be ``kind`` at ``revision``."""
    try:
        async with asyncio.timeout(SIGHT_TIMEOUT):
            seen = await sightings.next()
    except TimeoutError:
        raise RuntimeError(
            f"the observer reported no {kind} change at revision {revision} within "
            f"{SIGHT_TIMEOUT} s"
        ) from None
    if (seen.kind, seen.revision) != (kind, revision):
        raise RuntimeError(
            f"the observer reported {seen.kind} at revision {seen.revision}; "
            f"expected {kind} at revision {revision}"
        )
    return seen


class ChildSightings:
    """Sightings read from an observer process's stdout."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        self._stdout = process.stdout

    async def next(self) -> Sighting:
        line = await self._stdout.readline()
        received = time.monotonic_ns()
        if not line:
            raise RuntimeError("the observer process exited early; its stderr says why")
        kind, revision, seen = line.decode().split()
        return Sighting(kind, int(revision), int(seen), received)


@contextlib.asynccontextmanager
async def child_observer(url: str) -> AsyncIterator[Sightings]:
    """An observer process on ``url``, ready on entry; ended (stdin closed) on exit."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.propagation", "--child", url,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    try:
        sightings = ChildSightings(process)
        await expect(sightings, "ready", 0)
        yield sightings
    finally:
        await _end(process)


async def _end(process: asyncio.subprocess.Process) -> None:
    assert process.stdin is not None
    process.stdin.close()
    try:
        async with asyncio.timeout(10):
            await process.wait()
    except TimeoutError:
        process.kill()
        await process.wait()


class LocalSightings:
    """Sightings of an observer running in this process (the memory store)."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Sighting] = asyncio.Queue()

    def emit(self, kind: str, revision: int) -> None:
        now = time.monotonic_ns()
        self._queue.put_nowait(Sighting(kind, revision, now, now))

    async def next(self) -> Sighting:
        return await self._queue.get()


@contextlib.asynccontextmanager
async def local_observer(store: Store) -> AsyncIterator[Sightings]:
    sightings = LocalSightings()
    async with owned(Observer(store, sightings.emit).run(), "in-process observer"):
        await expect(sightings, "ready", 0)
        yield sightings


# -- measuring --------------------------------------------------------------------------------


@dataclass
class Series:
    """Samples in nanoseconds, one list per measured quantity."""

    propagation: list[int]
    propagation_pipe: list[int]
    update_call: list[int]
    end_to_end: list[int]
    floor: list[int]
    floor_pipe: list[int]
    put_call: list[int]
    floor_end_to_end: list[int]

    @classmethod
    def empty(cls) -> Series:
        return cls([], [], [], [], [], [], [], [])


async def one_update(store: Store, key: str, sightings: Sightings, round_: int) -> tuple[int, ...]:
    op = TaintUpdate.replace([f"bench/round={round_}"])
    start = time.monotonic_ns()
    result = await update_taints(store, key, op)
    returned = time.monotonic_ns()
    seen = await expect(sightings, "view", result.revision)
    return (
        seen.seen_ns - returned,
        seen.received_ns - returned,
        returned - start,
        seen.seen_ns - start,
    )


async def one_put(store: Store, sightings: Sightings, round_: int) -> tuple[int, ...]:
    value = f"{round_:016d}".encode().ljust(FLOOR_BYTES, b".")
    start = time.monotonic_ns()
    revision = await store.put(FLOOR_KEY, value)
    returned = time.monotonic_ns()
    seen = await expect(sightings, "floor", revision)
    return (
        seen.seen_ns - returned,
        seen.received_ns - returned,
        returned - start,
        seen.seen_ns - start,
    )


async def rounds(store: Store, key: str, sightings: Sightings, n: int) -> Series:
    """``WARMUP`` unrecorded rounds, then ``n``, each an update and a floor put in turn."""
    series = Series.empty()
    for round_ in range(WARMUP + n):
        update = await one_update(store, key, sightings, round_)
        put = await one_put(store, sightings, round_)
        if round_ >= WARMUP:
            for samples, sample in zip(_columns(series), (*update, *put), strict=True):
                samples.append(sample)
    return series


def _columns(s: Series) -> tuple[list[int], ...]:
    return (
        s.propagation, s.propagation_pipe, s.update_call, s.end_to_end,
        s.floor, s.floor_pipe, s.put_call, s.floor_end_to_end,
    )  # fmt: skip


async def measure_backend(backend: str, url: str, n: int) -> Series:
    async with await open_store(url) as store:
        lease = await store.grant(LEASE_TTL)
        async with owned(keep_alive(store, lease), "worker lease keep-alive"):
            record, _ = await register(store, make_record(), lease)
            observer = local_observer(store) if backend == "memory" else child_observer(url)
            async with observer as sightings:
                return await rounds(store, record.key, sightings, n)


@dataclass(frozen=True)
class Row:
    backend: str
    series: Series

    def stats(self) -> dict[str, Stats]:
        s = self.series
        return {name: Stats.of(samples) for name, samples in vars(s).items()}

    def cells(self) -> list[str]:
        st = self.stats()
        prop, floor = st["propagation"], st["floor"]
        label = "memory (in-process)" if self.backend == "memory" else self.backend
        return [
            label,
            ms(prop.p50_ms),
            ms(prop.p99_ms),
            ms(floor.p50_ms),
            ms(floor.p99_ms),
            overhead(prop, floor, ratio=False),  # both can be ~0: the ratio says nothing
            ms(st["update_call"].p50_ms),
            ms(st["put_call"].p50_ms),
            ms(st["end_to_end"].p50_ms),
            ms(st["end_to_end"].p99_ms),
            ms(st["floor_end_to_end"].p50_ms),
        ]

    def json(self) -> dict[str, Any]:
        stats = {name: stats_json(s) for name, s in self.stats().items()}
        return {"backend": self.backend, "in_process": self.backend == "memory", **stats}


HEADERS = (
    "backend",
    "propagation p50",
    "p99",
    "floor p50",
    "p99",
    "overhead",
    "update call p50",
    "put call p50",
    "call start→view p50",
    "p99",
    "put start→watch p50",
)


async def measure(urls: dict[str, str], n: int) -> list[Row]:
    return [Row(backend, await measure_backend(backend, url, n)) for backend, url in urls.items()]


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.propagation", description=__doc__)
    parser.add_argument("--updates", type=int, default=300, help="rounds per backend")
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.updates < 1:
        parser.error(f"--updates {args.updates} must be at least 1")
    return args


def run(args: argparse.Namespace) -> int:
    found = versions()
    detail = (
        f"{args.updates} taint updates per backend after {WARMUP} warm-up, observer in "
        "another process, latencies in ms from the call returning"
    )
    print(header("taint propagation", found, detail))
    with places(args.backends) as where:
        rows = asyncio.run(measure(where.urls, args.updates))
    print(render_table(HEADERS, [r.cells() for r in rows]))
    write_json(
        args.json,
        {
            "benchmark": "propagation",
            "versions": found,
            "updates": args.updates,
            "warmup": WARMUP,
            "rows": [r.json() for r in rows],
        },
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.child:
        return child_main(args.child)
    return interruptible(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
