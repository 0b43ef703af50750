"""Exit-drain experiment: does the Python client's drain at exit make scripts exit cleanly?

    python -m bench.exit_drain [--runs 1000] [--blocking-runs 200] [--parallel 8] [--json PATH]

A real ``dynamod`` and a mocker worker run on a file store while a churner moves the
worker's taints through its route 50 times a second, so every discovery event stream is
live. Each run is a fresh Python process executing a script that **forgets to close its
client**: once its ``events()`` stream has delivered an event it prints a line and ends,
with the client open and the stream still receiving.

* ``async``: ``asyncio.run(main())`` where ``main`` opens an ``AsyncClient``, starts a task
  iterating ``client.events()``, waits for the first event and returns (the script the
  issue names);
* ``blocking``: a ``Client`` whose ``events()`` iterator has yielded one event, left open.

Each script runs in two arms, interleaved in a shuffled order so background load hits both
alike: **with the drain** (the default, 250 ms) and **without** (``DYNAMO_DRAIN=0``). What
is judged is the exit, from the script's line to the process's end: a run is *noisy* when
it exits non-zero, does not exit within ``--exit-timeout`` (hung: killed), or its stderr
holds ``Task was destroyed``, ``Exception ignored``, a ``Traceback`` or ``Fatal Python
error``. A run that does not reach its line within ``--start-timeout`` (a start starved by
load) is counted apart and left out of the comparison. The table gives both counts per
script, the two-sided Fisher exact p-value of the difference (computed here from the
hypergeometric distribution) and each arm's p50 exit time (what the drain costs).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import Stats, header, interruptible, render_table, write_json
from tests.support.processes import daemon_argv, env, started, worker_argv

NOISE = ("Task was destroyed", "Exception ignored", "Traceback", "Fatal Python error")
CHURN_PER_SECOND = 50

SCRIPTS = {
    "async": """
import asyncio, sys
from dynamod.client import AsyncClient

async def main():
    client = AsyncClient(sys.argv[1])
    first = asyncio.Event()

    async def follow():
        async for _ in client.events():
            first.set()

    globals()["follower"] = asyncio.create_task(follow())  # kept, never awaited
    await first.wait()
    print("streaming", flush=True)  # returns with the client open, its stream receiving

asyncio.run(main())
""",
    "blocking": """
import sys
from dynamod.client import Client

client = Client(sys.argv[1])
events = client.events()
next(events)
print("streaming", flush=True)  # exits with the client open, its stream receiving
""",
}


@dataclass(frozen=True)
class Run:
    """One run. ``code`` None: it did not exit in time after its line (hung, killed);
    ``started`` False: it never reached its line (left out of the comparison)."""

    script: str
    drain: bool
    started: bool
    code: int | None
    stderr: str
    exit_seconds: float

    @property
    def reasons(self) -> list[str]:
        found = [n for n in NOISE if n in self.stderr]
        if self.code is None:
            found.append("hung")
        elif self.code != 0:
            found.append(f"exit {self.code}")
        return found

    @property
    def noisy(self) -> bool:
        return bool(self.reasons)


def fisher_exact(a: int, b: int, c: int, d: int) -> float:
    """Two-sided Fisher exact p-value of the 2x2 table [[a, b], [c, d]]: the probability,
    with the margins fixed, of a table at most as likely as this one."""
    row1, row2, col1 = a + b, c + d, a + c
    total = row1 + row2

    def log_p(x: int) -> float:
        return _log_choose(row1, x) + _log_choose(row2, col1 - x) - _log_choose(total, col1)

    observed = log_p(a)
    low, high = max(0, col1 - row2), min(col1, row1)
    p = sum(math.exp(log_p(x)) for x in range(low, high + 1) if log_p(x) <= observed + 1e-7)
    return min(1.0, p)


def _log_choose(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


# -- the cluster --------------------------------------------------------------------------


@contextlib.contextmanager
def cluster(scratch: Path) -> Iterator[tuple[str, str]]:
    """dynamod and one worker on a file store: (gRPC endpoint, the worker's route URL)."""
    store = (scratch / "store").as_uri()
    socket = scratch / "dynamod.sock"
    with contextlib.ExitStack() as stack:
        dynamod = started(daemon_argv(store, socket), r"^dynamod ready:", scratch / "d.log")
        stack.callback(dynamod.stop)
        worker = started(worker_argv(store, "llama"), r"^dynamo-worker ready:", scratch / "w.log")
        stack.callback(worker.stop)
        yield f"unix://{socket}", worker.field("system") + "/engine/update/model_taints"


@contextlib.contextmanager
def churning(route: str) -> Iterator[Counter[int]]:
    """Move the worker's taints ``CHURN_PER_SECOND`` times a second until the block ends;
    the counter holds the route's answers by status."""
    stop, answers = threading.Event(), Counter[int]()

    def churn() -> None:
        for n in itertools.count():
            if stop.wait(1 / CHURN_PER_SECOND):
                return
            body = json.dumps({"taints": [f"churn=n{n % 8}"]}).encode()
            request = urllib.request.Request(
                route, data=body, method="POST", headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as reply:
                    answers[reply.status] += 1
            except urllib.error.HTTPError as refused:  # counted: the table says how many
                answers[refused.code] += 1

    thread = threading.Thread(target=churn, name="churn")
    thread.start()
    try:
        yield answers
    finally:
        stop.set()
        thread.join()


# -- the runs ---------------------------------------------------------------------------------


def run_once(script: Path, name: str, drain: bool, endpoint: str, args: argparse.Namespace) -> Run:
    """One fresh process running ``script`` against ``endpoint``, with or without the drain;
    its exit is timed from the line the script prints once its stream is live."""
    environ = {k: v for k, v in env().items() if k != "DYNAMO_DRAIN"}
    if not drain:
        environ["DYNAMO_DRAIN"] = "0"
    proc = subprocess.Popen(
        [sys.executable, str(script), endpoint],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=environ,
    )  # fmt: skip
    assert proc.stdout is not None
    starved = threading.Timer(args.start_timeout, proc.kill)
    starved.start()
    line = proc.stdout.readline()
    starved.cancel()
    marked = time.perf_counter()
    try:
        _, err = proc.communicate(timeout=args.exit_timeout)
    except subprocess.TimeoutExpired:  # it hung at exit
        proc.kill()
        _, err = proc.communicate()
        return Run(name, drain, True, None, err.decode(errors="replace"), args.exit_timeout)
    seconds = time.perf_counter() - marked
    text = err.decode(errors="replace")
    if not line and proc.returncode == -signal.SIGKILL:  # killed before its line: starved
        return Run(name, drain, False, proc.returncode, text, seconds)
    return Run(name, drain, True, proc.returncode, text, seconds)


def plan(runs: int, blocking_runs: int, seed: int) -> list[tuple[str, bool]]:
    arms = [("async", d) for d in (True, False) for _ in range(runs)]
    arms += [("blocking", d) for d in (True, False) for _ in range(blocking_runs)]
    random.Random(seed).shuffle(arms)
    return arms


def experiment(args: argparse.Namespace, scratch: Path) -> tuple[list[Run], Counter[int]]:
    scripts = {}
    for name, source in SCRIPTS.items():
        scripts[name] = scratch / f"{name}.py"
        scripts[name].write_text(source)
    order = plan(args.runs, args.blocking_runs, args.seed)
    with (
        cluster(scratch) as (endpoint, route),
        churning(route) as answers,
        ThreadPoolExecutor(max_workers=args.parallel) as pool,
    ):
        done = list(pool.map(lambda a: run_once(scripts[a[0]], a[0], a[1], endpoint, args), order))
    return done, answers


# -- the table ------------------------------------------------------------------------------


def arm_rows(runs: Sequence[Run]) -> list[dict[str, Any]]:
    rows = []
    for script in SCRIPTS:
        for drain in (True, False):
            arm = [r for r in runs if r.script == script and r.drain == drain]
            mine = [r for r in arm if r.started]
            if not mine:
                continue
            reasons = Counter(reason for r in mine for reason in r.reasons)
            seconds = Stats.of([int(r.exit_seconds * 1e9) for r in mine])
            rows.append(
                {
                    "script": script,
                    "drain": drain,
                    "runs": len(mine),
                    "not_started": len(arm) - len(mine),
                    "noisy": sum(r.noisy for r in mine),
                    "reasons": dict(sorted(reasons.items())),
                    "exit_p50_ms": seconds.p50_ms,
                    "exit_p99_ms": seconds.p99_ms,
                }
            )
    return rows


def comparisons(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    found = {}
    for script in SCRIPTS:
        pair = {r["drain"]: r for r in rows if r["script"] == script}
        if len(pair) == 2:
            on, off = pair[True], pair[False]
            found[script] = fisher_exact(
                on["noisy"], on["runs"] - on["noisy"], off["noisy"], off["runs"] - off["noisy"]
            )
    return found


def table(rows: Sequence[dict[str, Any]], p_values: dict[str, float]) -> str:
    lines = []
    for row in rows:
        reasons = ", ".join(f"{k} {v}" for k, v in row["reasons"].items()) or "—"
        p = p_values.get(row["script"])
        lines.append(
            [
                row["script"],
                "250 ms (default)" if row["drain"] else "off (DYNAMO_DRAIN=0)",
                str(row["runs"]),
                str(row["noisy"]),
                reasons,
                f"{row['exit_p50_ms']:.0f} / {row['exit_p99_ms']:.0f}",
                str(row["not_started"]),
                "—" if p is None or not row["drain"] else f"{p:.3g}",
            ]
        )
    headers = ["script", "drain", "runs", "noisy", "why", "exit p50/p99 ms", "starved", "Fisher p"]
    return render_table(headers, lines)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.exit_drain", description=__doc__)
    parser.add_argument("--runs", type=int, default=1000, help="runs per arm, async script")
    parser.add_argument("--blocking-runs", type=int, default=200, help="per arm, blocking")
    parser.add_argument("--parallel", type=int, default=8, help="runs at once")
    parser.add_argument(
        "--exit-timeout", type=float, default=10.0, help="seconds from the line to 'hung'"
    )
    parser.add_argument(
        "--start-timeout", type=float, default=60.0, help="seconds to the line ('starved')"
    )
    parser.add_argument("--seed", type=int, default=15, help="order of the interleaved runs")
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dynamod-exit-drain-") as scratch:
        runs, answers = experiment(args, Path(scratch))
    rows = arm_rows(runs)
    p_values = comparisons(rows)
    found = {"python": sys.version.split()[0]}
    detail = (
        f"{args.runs} + {args.runs} async runs, {args.blocking_runs} + {args.blocking_runs} "
        f"blocking, {args.parallel} at once, {time.monotonic() - began:.0f} s"
    )
    print(header("exit drain", found, detail))
    print(table(rows, p_values))
    churned = sum(answers.values())
    print(f"\ntaint moves during the runs: {churned} ({dict(answers)} by status)")
    samples = [r for r in runs if r.started and r.noisy][:3]
    for sample in samples:
        print(f"\nnoisy {sample.script} run (drain {'on' if sample.drain else 'off'}): "
              f"{sample.reasons}\n{sample.stderr.strip()[-600:]}")  # fmt: skip
    write_json(
        args.json,
        {
            "rows": rows,
            "fisher_p": p_values,
            "args": {k: v for k, v in vars(args).items() if k != "json"},
            "churn": churned,
            "seconds": time.monotonic() - began,
            "cpus": len(os.sched_getaffinity(0)),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(interruptible(main))
