"""Store latency: put, compare-and-swap and put→watch, per backend, beside the raw client.

    python -m bench.store_latency                      # every backend, 500 ops per cell
    python -m bench.store_latency --ops 2000 --backends etcd nats --json out.json

For each backend this measures, through ``dynamod.store`` (*ours*) and through the client
library underneath it (*raw*, the floor), in the same run and interleaved in blocks so that
background load hits both alike:

* ``put``       — an unconditional write of one key;
* ``cas``       — a write conditional on the key's revision (``put(expect=rev)``), chained;
* ``put→watch`` — from just before a put on one store instance to the event arriving in a
  watch opened on a *second* instance (a second connection). The memory store cannot share
  state between instances, so there it is one instance.

The floors: ``aetcd`` put / txn on ``mod_revision`` / watch on a second client for etcd;
``nats-py`` KV put / ``update(last=)`` / ``watch`` on a second connection for NATS; for the
file store, which has no library underneath, a temp file written (no fsync) and moved over
the key with ``os.replace``, with ``flock`` + read for the CAS and inotify for the watch.
The memory store is a reference row with no floor. Values are ``VALUE_BYTES`` long, about
the size of a worker record.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import itertools
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aetcd
import nats
from nats.js import api
from nats.js.kv import KeyValue

from bench.common import (
    Places,
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
from dynamod.store import Put, Resync, Store, Watch, open_store
from dynamod.store.file.inotify import IN_MOVED_TO, Inotify

BACKENDS = ("memory", "file", "etcd", "nats")
OPS = ("put", "cas", "put→watch")
VALUE_BYTES = 512
WARMUP = 50
BLOCK = 25  # ours and raw alternate in blocks of this many operations
EVENT_TIMEOUT = 5.0

FLOORS = {
    "memory": {
        "put": "none: in-process reference",
        "cas": "none: in-process reference",
        "put→watch": "none: one instance (memory:// is per process)",
    },
    "file": {
        "put": "tmp write + os.replace, no fsync",
        "cas": "flock + read + tmp write + os.replace",
        "put→watch": "os.replace → inotify wake-up + read",
    },
    "etcd": {
        "put": "aetcd put",
        "cas": "aetcd txn on mod_revision",
        "put→watch": "aetcd put → watch on a 2nd client",
    },
    "nats": {
        "put": "nats-py kv.put",
        "cas": "nats-py kv.update(last=)",
        "put→watch": "nats-py kv.put → kv.watch on a 2nd conn",
    },
}

Op = Callable[[], Awaitable[int]]
"""One measured operation; returns its latency in nanoseconds."""


def value_of(counter: Iterator[int]) -> bytes:
    return f"{next(counter):016d}".encode().ljust(VALUE_BYTES, b".")


class Arrivals:
    """Values a watch delivered, each with the moment (``perf_counter_ns``) it arrived."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[tuple[bytes, int]] = asyncio.Queue()
        self.synced = asyncio.Event()
        """Set once the watch delivered its initial state: later writes arrive as events,
        not folded into a snapshot (ours) or the "snapshot done" marker (nats-py)."""

    def saw(self, value: bytes) -> None:
        self._queue.put_nowait((value, time.perf_counter_ns()))

    async def wait_synced(self) -> None:
        try:
            async with asyncio.timeout(EVENT_TIMEOUT):
                await self.synced.wait()
        except TimeoutError:
            raise RuntimeError(
                f"the watch delivered no initial state within {EVENT_TIMEOUT} s"
            ) from None

    async def arrival_of(self, value: bytes) -> int:
        """When ``value`` arrived; earlier values still queued (a snapshot) are skipped."""
        try:
            async with asyncio.timeout(EVENT_TIMEOUT):
                while True:
                    seen, at = await self._queue.get()
                    if seen == value:
                        return at
        except TimeoutError:
            raise RuntimeError(
                f"the watch delivered no event for value {value[:16]!r} within "
                f"{EVENT_TIMEOUT} s of the put"
            ) from None


class Target(Protocol):
    """One way to reach a backend: ours, or the raw floor. Each op uses its own key."""

    async def put(self, value: bytes) -> None: ...

    async def cas(self, value: bytes) -> None:
        """Write conditionally on the revision this target wrote last."""

    async def put_watched(self, value: bytes) -> None: ...

    def watching(self) -> contextlib.AbstractAsyncContextManager[Arrivals]:
        """A watch on the watched key from a second connection, established on entry."""


# -- ours ------------------------------------------------------------------------------------


class OurStore:
    """``dynamod.store``: writes on one instance; the watch on a second one, opened only
    for the put→watch phase so that put and cas run without a reader in the process."""

    def __init__(self, writer: Store, cas_revision: int) -> None:
        self.writer = writer
        self._revision = cas_revision

    async def put(self, value: bytes) -> None:
        await self.writer.put("bench/put", value)

    async def cas(self, value: bytes) -> None:
        self._revision = await self.writer.put("bench/cas", value, expect=self._revision)

    async def put_watched(self, value: bytes) -> None:
        await self.writer.put("bench/watched", value)

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[Arrivals]:
        arrivals = Arrivals()
        async with (
            self._reader() as reader,
            reader.watch("bench/watched") as watch,
            owned(_follow_ours(watch, arrivals), "follow our watch"),
        ):
            await arrivals.wait_synced()
            yield arrivals

    @contextlib.asynccontextmanager
    async def _reader(self) -> AsyncIterator[Store]:
        if self.writer.url.startswith("memory:"):  # memory:// instances share nothing
            yield self.writer
            return
        async with await open_store(self.writer.url) as reader:
            yield reader


async def _follow_ours(watch: Watch, arrivals: Arrivals) -> None:
    async for event in watch:
        if isinstance(event, Put):
            arrivals.saw(event.entry.value)
        elif isinstance(event, Resync):
            arrivals.synced.set()


@contextlib.asynccontextmanager
async def open_ours(url: str) -> AsyncIterator[OurStore]:
    async with await open_store(url) as writer:
        yield OurStore(writer, await writer.put("bench/cas", b"0"))


# -- raw floors ------------------------------------------------------------------------------


class EtcdFloor:
    """aetcd on its own: put, a txn comparing ``mod_revision``, a watch on a second client."""

    def __init__(self, writer: Any, reader: Any, cas_revision: int) -> None:
        self.writer = writer
        self.reader = reader
        self._revision = cas_revision

    async def put(self, value: bytes) -> None:
        await self.writer.put(b"raw/put", value)

    async def cas(self, value: bytes) -> None:
        txn = self.writer.transactions
        ok, responses = await self.writer.transaction(
            compare=[txn.mod(b"raw/cas") == self._revision],
            success=[txn.put(b"raw/cas", value)],
            failure=[],
        )
        if not ok:
            raise RuntimeError(f"raw etcd CAS at revision {self._revision} lost to nobody")
        self._revision = responses[0].response_put.header.revision

    async def put_watched(self, value: bytes) -> None:
        await self.writer.put(b"raw/watched", value)

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[Arrivals]:
        arrivals = Arrivals()
        watch = await self.reader.watch(b"raw/watched")
        try:
            async with owned(_follow_etcd(watch, arrivals), "follow the raw etcd watch"):
                await arrivals.wait_synced()
                yield arrivals
        finally:
            await watch.cancel()


async def _follow_etcd(watch: Any, arrivals: Arrivals) -> None:
    arrivals.synced.set()  # an aetcd watch is established when `watch()` returns
    async for event in watch:
        arrivals.saw(event.kv.value)


@contextlib.asynccontextmanager
async def open_etcd_floor(endpoint: str) -> AsyncIterator[EtcdFloor]:
    host, _, port = endpoint.rpartition(":")
    async with aetcd.Client(host, int(port)) as writer, aetcd.Client(host, int(port)) as reader:
        created = await writer.put(b"raw/cas", b"0")
        yield EtcdFloor(writer, reader, created.header.revision)


class NatsFloor:
    """nats-py KV on its own: put, ``update(last=)``, ``watch`` on a second connection."""

    def __init__(self, writer: KeyValue, reader: KeyValue, cas_revision: int) -> None:
        self.writer = writer
        self.reader = reader
        self._revision = cas_revision

    async def put(self, value: bytes) -> None:
        await self.writer.put("put", value)

    async def cas(self, value: bytes) -> None:
        self._revision = await self.writer.update("cas", value, last=self._revision)

    async def put_watched(self, value: bytes) -> None:
        await self.writer.put("watched", value)

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[Arrivals]:
        arrivals = Arrivals()
        watcher = await self.reader.watch("watched")
        try:
            async with owned(_follow_nats(watcher, arrivals), "follow the raw NATS watch"):
                await arrivals.wait_synced()
                yield arrivals
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]  # unannotated in nats-py


async def _follow_nats(watcher: KeyValue.KeyWatcher, arrivals: Arrivals) -> None:
    async for entry in watcher:
        if entry is None:  # nats-py's "initial values delivered" marker
            arrivals.synced.set()
        elif entry.value is not None:
            arrivals.saw(entry.value)


@contextlib.asynccontextmanager
async def open_nats_floor(address: str) -> AsyncIterator[NatsFloor]:
    async with contextlib.AsyncExitStack() as stack:
        writer_conn = await nats.connect(address)
        stack.push_async_callback(writer_conn.close)
        reader_conn = await nats.connect(address)
        stack.push_async_callback(reader_conn.close)
        config = api.KeyValueConfig(bucket="raw", history=1)
        writer = await writer_conn.jetstream().create_key_value(config)
        reader = await reader_conn.jetstream().key_value("raw")
        yield NatsFloor(writer, reader, await writer.put("cas", b"0"))


class FileFloor:
    """Plain files: a temp file written (no fsync) and moved over the key, one directory
    per op. CAS takes an ``flock`` and reads the current revision from the file's first
    line; the watch is inotify on the watched key's directory, then a read of the file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for name in ("put", "cas", "watched", "tmp"):
            (root / name).mkdir(parents=True, exist_ok=True)
        self._lock = os.open(root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        self._revision = 0
        self._replace("cas", b"0\n")

    async def put(self, value: bytes) -> None:
        self._replace("put", value)

    async def cas(self, value: bytes) -> None:
        self._cas(value)

    async def put_watched(self, value: bytes) -> None:
        self._replace("watched", value)

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[Arrivals]:
        arrivals = Arrivals()
        notify = Inotify()
        loop = asyncio.get_running_loop()
        try:
            notify.add(self.root / "watched", IN_MOVED_TO, "watched")
            loop.add_reader(notify.fileno(), self._on_change, notify, arrivals)
            arrivals.synced.set()  # inotify watches from inotify_add_watch on
            try:
                yield arrivals
            finally:
                loop.remove_reader(notify.fileno())
        finally:
            notify.close()

    def close(self) -> None:
        os.close(self._lock)

    def _on_change(self, notify: Inotify, arrivals: Arrivals) -> None:
        if notify.drain():
            arrivals.saw((self.root / "watched" / "key").read_bytes())

    def _replace(self, directory: str, data: bytes) -> None:
        tmp = self.root / "tmp" / directory
        tmp.write_bytes(data)
        os.replace(tmp, self.root / directory / "key")

    def _cas(self, value: bytes) -> None:
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            current = (self.root / "cas" / "key").read_bytes().partition(b"\n")[0]
            if int(current) != self._revision:
                raise RuntimeError(f"raw file CAS found revision {current!r}, not {self._revision}")
            self._revision += 1
            self._replace("cas", b"%d\n%s" % (self._revision, value))
        finally:
            fcntl.flock(self._lock, fcntl.LOCK_UN)


@contextlib.asynccontextmanager
async def open_file_floor(root: Path) -> AsyncIterator[FileFloor]:
    floor = FileFloor(root)
    try:
        yield floor
    finally:
        floor.close()


def open_floor(
    backend: str, where: Places
) -> contextlib.AbstractAsyncContextManager[Target | None]:
    if backend == "etcd" and where.etcd_endpoint:
        return open_etcd_floor(where.etcd_endpoint)
    if backend == "nats" and where.nats_address:
        return open_nats_floor(where.nats_address)
    if backend == "file":
        return open_file_floor(where.scratch / "raw-files")
    return contextlib.nullcontext()


# -- measuring -------------------------------------------------------------------------------


def timed(action: Callable[[bytes], Awaitable[None]], counter: Iterator[int]) -> Op:
    async def op() -> int:
        value = value_of(counter)
        start = time.perf_counter_ns()
        await action(value)
        return time.perf_counter_ns() - start

    return op


def put_to_watch(target: Target, arrivals: Arrivals, counter: Iterator[int]) -> Op:
    async def op() -> int:
        value = value_of(counter)
        start = time.perf_counter_ns()
        await target.put_watched(value)
        return await arrivals.arrival_of(value) - start

    return op


async def interleaved(ours: Op, raw: Op | None, n: int) -> tuple[list[int], list[int] | None]:
    """``n`` samples of each after a warm-up, alternating in blocks of ``BLOCK``."""
    contenders = [ours] if raw is None else [ours, raw]
    for op in contenders:
        for _ in range(WARMUP):
            await op()
    samples: list[list[int]] = [[] for _ in contenders]
    for start in range(0, n, BLOCK):
        for op, series in zip(contenders, samples, strict=True):
            series.extend([await op() for _ in range(min(BLOCK, n - start))])
    return samples[0], (samples[1] if raw is not None else None)


async def measure_backend(
    ours: Target, raw: Target | None, n: int
) -> dict[str, tuple[list[int], list[int] | None]]:
    counter = itertools.count()
    results = {
        "put": await interleaved(
            timed(ours.put, counter), None if raw is None else timed(raw.put, counter), n
        ),
        "cas": await interleaved(
            timed(ours.cas, counter), None if raw is None else timed(raw.cas, counter), n
        ),
    }
    # The watches exist only now, so that put and cas above ran without a reader's load.
    async with contextlib.AsyncExitStack() as stack:
        ours_seen = await stack.enter_async_context(ours.watching())
        raw_op = None
        if raw is not None:
            raw_op = put_to_watch(raw, await stack.enter_async_context(raw.watching()), counter)
        results["put→watch"] = await interleaved(put_to_watch(ours, ours_seen, counter), raw_op, n)
    return results


@dataclass(frozen=True)
class Row:
    backend: str
    op: str
    ours: Stats
    raw: Stats | None
    floor: str

    def cells(self) -> list[str]:
        raw = self.raw
        return [
            self.backend,
            self.op,
            ms(self.ours.p50_ms),
            ms(self.ours.p99_ms),
            ms(raw.p50_ms if raw else None),
            ms(raw.p99_ms if raw else None),
            overhead(self.ours, raw),
            self.floor,
        ]

    def json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "op": self.op,
            "ours": stats_json(self.ours),
            "raw": stats_json(self.raw),
            "floor": self.floor,
        }


async def measure(where: Places, n: int) -> list[Row]:
    rows: list[Row] = []
    for backend, url in where.urls.items():
        async with open_ours(url) as ours, open_floor(backend, where) as raw:
            results = await measure_backend(ours, raw, n)
        for op, (ours_ns, raw_ns) in results.items():
            floor = FLOORS[backend][op]
            raw_stats = None if raw_ns is None else Stats.of(raw_ns)
            rows.append(Row(backend, op, Stats.of(ours_ns), raw_stats, floor))
    return rows


HEADERS = ("backend", "op", "ours p50", "ours p99", "raw p50", "raw p99", "overhead", "raw is")


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.store_latency", description=__doc__)
    parser.add_argument("--ops", type=int, default=500, help="samples per cell (default 500)")
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.ops < 1:
        parser.error(f"--ops {args.ops} must be at least 1")
    return args


def run(args: argparse.Namespace) -> int:
    found = versions()
    detail = f"{args.ops} ops per cell after {WARMUP} warm-up, latencies in ms"
    print(header("store latency", found, detail))
    with places(args.backends) as where:
        rows = asyncio.run(measure(where, args.ops))
    print(render_table(HEADERS, [r.cells() for r in rows]))
    write_json(
        args.json,
        {
            "benchmark": "store_latency",
            "versions": found,
            "ops": args.ops,
            "warmup": WARMUP,
            "value_bytes": VALUE_BYTES,
            "rows": [r.json() for r in rows],
        },
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    return interruptible(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
