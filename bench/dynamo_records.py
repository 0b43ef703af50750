"""What an NVIDIA Dynamo fleet's records cost the dynamod that reads them: many LoRA cards
under one worker, and cards too large to read.

    python -m bench.dynamo_records [--loras 5000] [--cards 6] [--card-mb 50]
                                   [--json PATH]

A private etcd (``--max-request-bytes`` raised so that it takes the large cards, as an
etcd configured that way would), one Dynamo worker shaped exactly like the captured ones
(``tests/dynamo/values.py``: its card and endpoint record on a lease of its own), and a
dynamod on ``dynamo+etcd://``. Nothing of Dynamo runs: only its records matter here.

1. **LoRA cards.** ``dynamoctl status`` (the Python client's ``status``, one warm
   connection, in a thread of its own) back to back: first with nothing else happening
   (the floor), then while ``--loras`` LoRA cards are put under the worker (16 at a time,
   on a lease, as Dynamo's vLLM worker registers them, from a process of their own so
   that the writer does not slow the sampler), until ``workers get`` counts them all.
   The daemon's RSS before, at its peak (sampled every 50 ms) and after.
2. **Cards too large to read.** ``--cards`` workers whose card is ``--card-mb`` MB, each
   put after the last was refused (``dynamod_dynamo_records_refused_total`` counts it),
   on etcd and on Dynamo's file store (a file each, under ``DYN_FILE_KV``'s layout); the
   daemon's RSS before and after all of them.

Tables on stdout; ``--json`` writes the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import re
import shlex
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psutil

from bench.common import Stats, header, interruptible, ms, render_table
from dynamod.client import AsyncClient, Client
from dynamod.store.etcd import EtcdStore
from tests.dynamo import values
from tests.dynamo.fleet import RoomyEtcd
from tests.support.processes import Spawned, daemon_argv, started
from tests.support.servers import EtcdServer

Json = dict[str, Any]
WORKER = 0x13B0A2323C378618
SEEN_WITHIN = 600.0
WRITE_WITHIN = 60.0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    print(header("Dynamo records", {"python": platform.python_version()},
                 f"{args.loras} LoRA cards, {args.cards} cards of {args.card_mb} MB"))  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="dynamod-bench-records-") as scratch:
        work = Path(scratch)
        with _etcd(work / "etcd") as etcd:
            loras = asyncio.run(_loras(etcd, work / "loras", args.loras))
            large = {"etcd": _large_on_etcd(etcd, work / "large-etcd", args.cards, args.card_mb)}
        large["file"] = _large_on_files(work / "large-file", args.cards, args.card_mb)
    document = {"command": shlex.join(["python", "-m", "bench.dynamo_records", *sys.argv[1:]]),
                "load_before": os.getloadavg(), "loras": loras, "large": large}  # fmt: skip
    print(render_table(*lora_table(loras)))
    print()
    print(render_table(*large_table(large)))
    if args.json:
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loras", type=int, default=5000, help="LoRA cards under one worker")
    parser.add_argument("--cards", type=int, default=6, help="cards too large to read")
    parser.add_argument("--card-mb", type=int, default=50, help="the size of each, in MB")
    parser.add_argument("--json", type=Path, help="write the figures here")
    return parser.parse_args(argv)


@contextmanager
def _etcd(workdir: Path) -> Iterator[EtcdServer]:
    etcd = RoomyEtcd(workdir)
    etcd.start()
    try:
        yield etcd
    finally:
        etcd.stop()


@contextmanager
def _daemon(store_url: str, work: Path) -> Iterator[tuple[Spawned, psutil.Process]]:
    work.mkdir(parents=True)
    daemon = started(daemon_argv(store_url, work / "d.sock"), r"^dynamod ready:",
                     work / "dynamod.log")  # fmt: skip
    try:
        yield daemon, psutil.Process(daemon.proc.pid)
    finally:
        daemon.finish()


async def _open(url: str) -> EtcdStore:
    """The bench's own etcd client, patient: a loaded machine's etcd may take seconds."""
    store = await EtcdStore.open(url)
    store.timeout = WRITE_WITHIN
    return store


# -- 1. LoRA cards under one worker ----------------------------------------------------------


async def _loras(etcd: EtcdServer, work: Path, count: int) -> Json:
    store = await _open(etcd.url())
    try:
        lease = await store.grant(600)
        await store.put(values.card_key(WORKER), values.card(WORKER), lease=lease)
        await store.put(values.instance_key(WORKER), values.instance(WORKER), lease=lease)
        with _daemon(f"dynamo+etcd://{etcd.endpoint}", work) as (_, process):
            endpoint = f"unix://{work / 'd.sock'}"
            with _Sampler(endpoint, etcd.url(), process) as quiet:
                await asyncio.sleep(3.0)
            with _Sampler(endpoint, etcd.url(), process) as busy:
                began, cpu = time.monotonic(), _cpu(process)
                writer = multiprocessing.get_context("spawn").Process(
                    target=write_loras, args=(etcd.url(), count), name="LoRA writer"
                )
                writer.start()
                await asyncio.to_thread(writer.join)
                if writer.exitcode != 0:
                    raise RuntimeError(f"the LoRA writer exited {writer.exitcode}")
                await _seen(endpoint, count)
                seen, cpu = time.monotonic() - began, _cpu(process) - cpu
            after = process.memory_info().rss
        await store.revoke(lease)
    finally:
        await store.aclose()
    return {"loras": count, "seen_s": seen, "daemon_cpu_s": cpu,
            "rss_before_mb": quiet.rss[0] / 2**20,
            "rss_peak_mb": max(busy.rss) / 2**20, "rss_after_mb": after / 2**20,
            "status_quiet": vars(Stats.of(quiet.latencies)),
            "status_busy": vars(Stats.of(busy.latencies)),
            "store_quiet": vars(Stats.of(quiet.store)),
            "store_busy": vars(Stats.of(busy.store))}  # fmt: skip


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def write_loras(url: str, count: int) -> None:
    """``count`` LoRA cards under the worker, 16 at a time, on a lease (in a process of
    its own)."""

    async def all_of_them() -> None:
        store = await _open(url)
        try:
            lease = await store.grant(600)
            gate = asyncio.Semaphore(16)

            async def one(index: int) -> None:
                name = f"lora-{index:05d}"
                value = values.lora_card(WORKER, name)
                async with gate:
                    await store.put(values.card_key(WORKER, name), value, lease=lease)

            await asyncio.gather(*(one(i) for i in range(count)))
        finally:
            await store.aclose()

    asyncio.run(all_of_them())


async def _seen(endpoint: str, count: int) -> None:
    """Until ``workers get`` counts ``count`` adapters on the worker."""
    async with AsyncClient(endpoint, timeout=60) as client:
        deadline = time.monotonic() + SEEN_WITHIN
        while adapters(await client.get_worker(f"{WORKER:x}")) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"dynamod did not show {count} adapters in {SEEN_WITHIN} s")
            await asyncio.sleep(0.2)


def adapters(info: Any) -> int:
    """How many LoRA adapters the worker is shown with (a count, or the names)."""
    record = info.record
    shown = record.extra.get("dynamo", {})
    if "lora_count" in shown:
        return int(shown["lora_count"])
    return len(record.model_card.extra.get("dynamo", {}).get("loras", []))


class _Sampler:
    """While open, in threads of its own: ``status`` back to back; the read ``status``
    makes of the store (a get of Dynamo's ``v1`` on etcd, from this process: the floor
    under load), back to back; the daemon's RSS every 50 ms."""

    def __init__(self, endpoint: str, etcd: str, process: psutil.Process) -> None:
        self.endpoint, self.etcd, self.process = endpoint, etcd, process
        self.latencies: list[int] = []
        self.store: list[int] = []
        self.rss: list[int] = [process.memory_info().rss]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=f) for f in (self._status, self._get, self._rss)]

    def __enter__(self) -> _Sampler:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _status(self) -> None:
        with Client(self.endpoint, timeout=60) as client:
            while not self._stop.is_set():
                began = time.perf_counter_ns()
                client.status()
                self.latencies.append(time.perf_counter_ns() - began)
                self._stop.wait(0.005)

    def _get(self) -> None:
        async def gets() -> None:
            store = await EtcdStore.open(self.etcd)
            try:
                while not self._stop.is_set():
                    began = time.perf_counter_ns()
                    await store.get("v1")
                    self.store.append(time.perf_counter_ns() - began)
                    await asyncio.sleep(0.005)
            finally:
                await store.aclose()

        asyncio.run(gets())

    def _rss(self) -> None:
        while not self._stop.wait(0.05):
            self.rss.append(self.process.memory_info().rss)


def lora_table(found: Json) -> tuple[list[str], list[list[str]]]:
    headers = ["call", "n", "p50 ms", "p99", "max", "daemon RSS MB"]
    during = (f"while {found['loras']:,} LoRA cards arrive under one worker "
              f"({found['seen_s']:.1f} s; the daemon used {found['daemon_cpu_s']:.1f} s of "
              "CPU)")  # fmt: skip
    rss = (f"{found['rss_before_mb']:.0f} → peak {found['rss_peak_mb']:.0f} → "
           f"{found['rss_after_mb']:.0f}")  # fmt: skip
    rows = []
    for call, quiet, busy in (
        ("dynamoctl status", found["status_quiet"], found["status_busy"]),
        ("etcd get v1, status's own read (floor)", found["store_quiet"], found["store_busy"]),
    ):
        before = f"{found['rss_before_mb']:.0f}"
        rows.append([f"{call}, nothing else happening", str(quiet["n"]), ms(quiet["p50_ms"]),
                     ms(quiet["p99_ms"]), ms(quiet["max_ms"]), before])  # fmt: skip
        rows.append([f"{call}, {during}", str(busy["n"]), ms(busy["p50_ms"]), ms(busy["p99_ms"]),
                     ms(busy["max_ms"]), rss])  # fmt: skip
    return headers, rows


# -- 2. cards too large to read ---------------------------------------------------------------


def _large_on_etcd(etcd: EtcdServer, work: Path, cards: int, megabytes: int) -> Json:
    with _daemon(f"dynamo+etcd://{etcd.endpoint}", work) as (daemon, process):
        before = process.memory_info().rss
        for index in range(cards):
            asyncio.run(_put_large(etcd, WORKER + 1 + index, megabytes))
            _refused(daemon, index + 1)
        time.sleep(1.0)
        return {"rss_before_mb": before / 2**20, "rss_after_mb": process.memory_info().rss / 2**20}


async def _put_large(etcd: EtcdServer, number: int, megabytes: int) -> None:
    store = await _open(etcd.url())
    try:
        lease = await store.grant(600)
        await store.put(values.instance_key(number), values.instance(number), lease=lease)
        await store.put(values.card_key(number), large_card(number, megabytes), lease=lease)
    finally:
        await store.aclose()


def _large_on_files(work: Path, cards: int, megabytes: int) -> Json:
    root = work / "file_kv"
    for bucket in ("mdc", "instances"):
        (root / "v1" / bucket).mkdir(parents=True)
    with _daemon(f"dynamo+file://{root}", work / "daemon") as (daemon, process):
        before = process.memory_info().rss
        for index in range(cards):
            number = WORKER + 1 + index
            _write_file(root, values.instance_key(number), values.instance(number))
            _write_file(root, values.card_key(number), large_card(number, megabytes))
            _refused(daemon, index + 1)
        time.sleep(1.0)
        return {"rss_before_mb": before / 2**20, "rss_after_mb": process.memory_info().rss / 2**20}


def _write_file(root: Path, key: str, value: bytes) -> None:
    """As Dynamo's file store writes a key: a temporary file, renamed into place."""
    bucket, _, rest = key.removeprefix("v1/").partition("/")
    path = root / "v1" / bucket / quote(rest, safe="").replace("-", "%2D").replace("_", "%5F")
    temporary = path.with_name(f".tmp_{os.getpid():x}")
    temporary.write_bytes(value)
    temporary.rename(path)


def large_card(number: int, megabytes: int) -> bytes:
    """A card like the captured one, made ``megabytes`` MB long by one large field."""
    card = json.loads(values.card(number))
    card["card_json"]["padding"] = "x" * (megabytes * 1_000_000)
    return json.dumps(card).encode()


def _refused(daemon: Spawned, count: int) -> None:
    """Until the daemon has counted ``count`` refused Dynamo records."""
    url = daemon.field("http") + "/metrics"
    deadline = time.monotonic() + SEEN_WITHIN
    pattern = re.compile(r'^dynamod_dynamo_records_refused_total\{kind="card"\} (\S+)$', re.M)
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url, timeout=30) as answer:
            found = pattern.search(answer.read().decode())
        if found and float(found.group(1)) >= count:
            return
        time.sleep(0.1)
    raise RuntimeError(f"dynamod did not refuse {count} large cards in {SEEN_WITHIN} s")


def large_table(found: Json) -> tuple[list[str], list[list[str]]]:
    headers = ["store", "daemon RSS before MB", "after MB", "growth MB"]
    rows = [
        [store, f"{f['rss_before_mb']:.0f}", f"{f['rss_after_mb']:.0f}",
         f"{f['rss_after_mb'] - f['rss_before_mb']:+.0f}"]
        for store, f in found.items()
    ]  # fmt: skip
    return headers, rows


if __name__ == "__main__":
    sys.exit(interruptible(main))
