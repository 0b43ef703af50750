"""Elastic pools against a static split and against no pools: one SLA, one trace, three arms.

    python -m bench.elastic                     # ~6 min: three arms of 115 s, a fleet each
    python -m bench.elastic --quick             # ~2 min: the same shape, shorter phases
    python -m bench.elastic --results bench/RESULTS.md   # + its section, plots/elastic.png
    python -m bench.elastic --from run.json     # report a run saved with --json

**The fleet**, new for each arm: ``--workers`` (6) mocker workers on etcd, each serving at
most ``--max-num-seqs`` (2) requests at once (``dynamo-worker --max-num-seqs``): a third
waits in the router's queue, since a worker whose running requests reach its card's
``max_num_seqs`` is busy (``router/knobs.py``, ``queue_threshold``). One ``dynamod`` fronts
them and leads the pools. A request is ``--max-tokens`` (10) tokens streamed from
``/v1/completions`` with ``--speedup-ratio`` 0.1: each mocker step lasts 50 ms (its 5 ms
base step, ten times slower), so a request takes about 0.5 s on a free slot and its first
token comes one step after it is admitted (~60 ms). A speed-up of 1 would make the same
0.5 s out of ~100 tokens: a hundred events to relay per request, which on two shared cores
measures the machine, not the pools.

**Two classes**: *premium* requires ``pool=premium`` and *batch* ``pool=batch``
(``nvext.routing_constraints.required_taints``). The policy is ``pool=premium: 34,
pool=batch: 66`` with ``min_per_pool: 1`` over ``model=elastic``: 2 and 4 of 6 workers.

**The trace**, the same for every arm: closed-loop clients (each sends its next request as
soon as the last one ends; prompts drawn from ``--seed``). Batch: ``--batch-clients`` (2)
for the whole run. Premium: ``--premium-low`` (2) clients, which its static 2 workers
hold with two slots to spare; then ``--premium-step`` (10) from the end of the low phase
for the step, and back to the low count (the extra clients finish the request they have
and stop). Ten clients on 2 workers' 4 slots queue: each request waits about 1.5 service
times (~0.8 s) before its first token. Twelve clients in all are the fleet's 12 slots: the
load fits the fleet, only not the static split, which is the case a policy that follows
demand can win (with more than the fleet holds, premium's gain is batch's loss).

**The arms**:

* ``static``: the policy as above.
* ``elastic``: the same plus ``elastic: {target_in_flight: 2, scale_down_after:
  --scale-down-after}``: a pool wants ``ceil(demand / 2)`` workers; premium at 10 clients
  wants 5, batch at 2 wants 1: 6 wanted of 6, each gets what it wants.
* ``no-pools``: no policy, no required taint: both classes on every worker, one FCFS
  queue (utilisation without isolation: 12 clients on 12 slots).

**The SLO**: premium time to first token <= ``--slo`` (0.5 s), just under one request's
service time (~0.53 s). A request that finds a free slot has its first token in one or two
mocker steps (60-110 ms); one that must wait for a request ahead of it to finish waits
part of a service time and, in a pool short of workers, whole ones. So the share within
the SLO is about the share of premium requests that found a slot in their pool, with room
for a loaded machine's slower steps. A request that fails counts as a miss.

**Measured**, per arm: premium TTFT p50 / p99 and the fraction within the SLO, for the
requests *sent during the step* and for all; batch requests completed per second over the
whole trace; errors (any answer but a whole 200 stream); moves the leader made during the
trace (its audit log, with their ``why``), and those made *while load was steady*: in a
phase, after ``--react`` seconds of a rise (the trace's start, the step's start) or
``--scale-down-after`` + ``--react`` seconds of a fall (the step's end). The premium pool's
size is sampled every 0.5 s from ``pools status`` (``PoolCount.actual``: routable
workers holding the taint).

**The goals** (issue 30), judged on the run, never assumed: during the step elastic premium
within the SLO >= 99 % where static is below 90 %; elastic batch throughput >= 0.9x the
static arm's over the whole trace; no elastic move while load is steady. The exit status is
1 when an arm could not run (a daemon refusing the ``elastic`` key, for one); a goal not met
is reported, not an error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import random
import shlex
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from bench import elastic_report
from bench.common import header, interruptible, owned, places, versions, write_json
from bench.pools import Daemon, start_daemon
from dynamod.client import AsyncClient
from dynamod.errors import PoolPolicyError
from dynamod.http.openai import WORKER_ID_HEADER
from tests.support.eventually import eventually
from tests.support.processes import Proc, worker

MODEL = "elastic"
POLICY = "sla"
PREMIUM, BATCH = "pool=premium", "pool=batch"
POOL_OF = {"premium": PREMIUM, "batch": BATCH}
ARMS = ("static", "elastic", "no-pools")
SAMPLE_EVERY = 0.5
REQUEST_TIMEOUT = 120.0
WORDS = (
    "river", "stone", "lamp", "orbit", "maple", "quartz", "harbor", "violet", "ember", "canyon",
    "tulip", "signal", "meadow", "copper", "falcon", "lantern", "glacier", "pepper", "saddle",
)  # fmt: skip


@dataclass(frozen=True)
class Trace:
    """The offered load, the same for every arm: closed-loop clients per class over time
    (seconds from the trace's start)."""

    low_s: float
    step_s: float
    after_s: float
    premium_low: int
    premium_step: int
    batch: int
    seed: int

    @property
    def step_start(self) -> float:
        return self.low_s

    @property
    def step_end(self) -> float:
        return self.low_s + self.step_s

    @property
    def end(self) -> float:
        return self.step_end + self.after_s

    def premium_clients(self, t: float) -> int:
        return self.premium_step if self.step_start <= t < self.step_end else self.premium_low


@dataclass(frozen=True)
class Setup:
    """The fleet, the requests, the SLO and the elastic section: what every arm shares."""

    workers: int
    max_num_seqs: int
    speedup: float
    max_tokens: int
    slo_s: float
    target_in_flight: float
    scale_down_after: float
    react_s: float
    trace: Trace

    def policy(self, elastic: bool) -> str:
        text = (
            f"name: {POLICY}\nselector: model={MODEL}\nmin_per_pool: 1\n"
            f"pools:\n  {PREMIUM}: 34\n  {BATCH}: 66\n"
        )
        if elastic:
            text += (
                f"elastic:\n  target_in_flight: {self.target_in_flight:g}\n"
                f"  scale_down_after: {self.scale_down_after:g}\n"
            )
        return text

    def steady(self) -> list[tuple[float, float]]:
        """The windows of steady load: each phase, less the time a policy may take to follow
        the change that began it (``react_s`` after a rise, ``scale_down_after`` more after
        a fall). Empty windows are left out."""
        t = self.trace
        windows = [
            (self.react_s, t.step_start),
            (t.step_start + self.react_s, t.step_end),
            (t.step_end + self.scale_down_after + self.react_s, t.end),
        ]
        return [(a, b) for a, b in windows if a < b]


FULL = Trace(low_s=20, step_s=60, after_s=35, premium_low=2, premium_step=10, batch=2, seed=30)
QUICK = replace(FULL, low_s=6, step_s=15, after_s=12)


@dataclass(frozen=True)
class Sample:
    """One request: its class, when it was sent and ended (s from the trace's start), its
    time to first token (None when it failed), its outcome (HTTP status or error class),
    and the worker that served it."""

    kind: str
    sent: float
    ttft: float | None
    done: float
    outcome: str
    worker: str


@dataclass(frozen=True)
class Sizes:
    """The policy's pools at one moment (``pools status``): routable workers per pool and,
    for an elastic policy, each pool's demand and the workers it wants (empty otherwise)."""

    t: float
    pools: dict[str, int]
    demand: dict[str, float] = field(default_factory=dict)
    want: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Move:
    """One move the leader made (its audit log), at ``t`` s from the trace's start."""

    t: float
    worker: str
    from_pool: str
    to_pool: str
    why: str


@dataclass
class Arm:
    """What one arm measured, or why it could not run (``refused``)."""

    name: str
    samples: list[Sample]
    sizes: list[Sizes]
    moves: list[Move]
    refused: str = ""


def prompt(rng: random.Random) -> str:
    """Eight seeded words: shorter than one KV block, so no prefix credit steers routing."""
    return " ".join(rng.choice(WORDS) for _ in range(8))


async def request(
    http: aiohttp.ClientSession, front: str, kind: str, text: str, setup: Setup, pooled: bool
) -> tuple[float | None, str, str]:
    """One streamed completion: TTFT (from before the POST to the first token's event), the
    outcome and the serving worker."""
    body: dict[str, Any] = {
        "model": MODEL, "prompt": text, "max_tokens": setup.max_tokens, "stream": True,
    }  # fmt: skip
    if pooled:
        body["nvext"] = {"routing_constraints": {"required_taints": [POOL_OF[kind]]}}
    sent, ttft = time.monotonic(), None
    try:
        async with http.post(f"{front}/v1/completions", json=body) as response:
            outcome, served = str(response.status), response.headers.get(WORKER_ID_HEADER, "")
            async for line in response.content:
                if ttft is None and line.startswith(b"data: {"):
                    ttft = time.monotonic() - sent
    except (aiohttp.ClientError, TimeoutError) as exc:
        return None, type(exc).__name__, ""
    return (ttft if outcome == "200" else None), outcome, served


async def closed_loop(
    http: aiohttp.ClientSession,
    front: str,
    kind: str,
    rng: random.Random,
    stop: asyncio.Event,
    started: float,
    setup: Setup,
    pooled: bool,
    out: list[Sample],
) -> None:
    """Closed loop: the next request as soon as the last one ends, until ``stop`` is set
    (the request in hand finishes)."""
    while not stop.is_set():
        sent = time.monotonic() - started
        ttft, outcome, served = await request(http, front, kind, prompt(rng), setup, pooled)
        out.append(Sample(kind, sent, ttft, time.monotonic() - started, outcome, served))


async def drive(front: str, setup: Setup, pooled: bool, started: float) -> list[Sample]:
    """The trace, from ``started`` (a ``time.monotonic()``): every client, and every one of
    their requests."""
    trace, out = setup.trace, list[Sample]()
    everyone, surge = asyncio.Event(), asyncio.Event()
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    async with (
        aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as http,
        asyncio.TaskGroup() as group,
    ):

        def start(kind: str, index: int, stop: asyncio.Event) -> None:
            rng = random.Random(f"{trace.seed}/{kind}/{index}")
            run = closed_loop(http, front, kind, rng, stop, started, setup, pooled, out)
            group.create_task(run, name=f"{kind}-{index}")

        for index in range(trace.batch):
            start("batch", index, everyone)
        for index in range(trace.premium_low):
            start("premium", index, everyone)
        await _until(started + trace.step_start)
        for index in range(trace.premium_low, trace.premium_step):
            start("premium", index, surge)
        await _until(started + trace.step_end)
        surge.set()
        await _until(started + trace.end)
        everyone.set()
    return sorted(out, key=lambda s: s.sent)


async def _until(moment: float) -> None:
    await asyncio.sleep(max(0.0, moment - time.monotonic()))


async def watch_sizes(control: AsyncClient, started: float, into: list[Sizes]) -> None:
    """The policy's pool sizes every ``SAMPLE_EVERY`` s, into ``into``."""
    while True:
        counts = (await control.pool_status(POLICY)).pools
        into.append(
            Sizes(
                time.monotonic() - started,
                {c.pool: c.actual for c in counts},
                {c.pool: c.demand for c in counts if c.demand is not None},
                {c.pool: c.want for c in counts if c.want is not None},
            )
        )
        await asyncio.sleep(SAMPLE_EVERY)


@contextlib.asynccontextmanager
async def fleet(url: str, scratch: Path, setup: Setup) -> AsyncIterator[Daemon]:
    """``setup.workers`` mocker workers and one dynamod on ``url``, once the daemon sees
    them all; every process killed on exit."""
    flags = ["--speedup-ratio", f"{setup.speedup:g}", "--max-num-seqs", str(setup.max_num_seqs)]
    async with contextlib.AsyncExitStack() as stack:
        procs: list[Proc] = [worker(url, *flags, model=MODEL) for _ in range(setup.workers)]
        for proc in procs:
            stack.push_async_callback(proc.kill)
        await asyncio.gather(*(p.start(within=90) for p in procs))
        leader = await start_daemon(stack, url, scratch, "leader")
        async with leader.client() as control:
            await eventually(
                lambda: control.list_workers(model=MODEL, fields=("id",)),
                lambda found: len(found[0]) == setup.workers,
                what=f"{setup.workers} workers in the daemon's view",
            )
        yield leader


async def balanced(control: AsyncClient, setup: Setup) -> None:
    """Until the leader has placed every worker in a pool and has nothing pending."""
    await eventually(
        lambda: control.pool_status(POLICY),
        lambda s: s.leading and s.balanced and sum(c.actual for c in s.pools) == setup.workers,
        within=60,
        what="the policy balanced over every worker",
    )


async def run_arm(name: str, url: str, scratch: Path, setup: Setup) -> Arm:
    """One arm on a fleet of its own: the policy (if any) applied and balanced, then the
    trace, with the pool sizes sampled beside it and the leader's moves read after it."""
    pooled = name != "no-pools"
    async with fleet(url, scratch, setup) as leader, leader.client() as control:
        if pooled:
            try:
                await control.apply_policy(setup.policy(elastic=name == "elastic"))
            except PoolPolicyError as exc:
                return Arm(name, [], [], [], refused=str(exc))
            await balanced(control, setup)
        before = len(leader.moves())
        sizes: list[Sizes] = []
        started, wall = time.monotonic(), time.time()
        front = leader.proc.field("http")
        if pooled:
            async with owned(watch_sizes(control, started, sizes), "pool sizes"):
                samples = await drive(front, setup, pooled, started)
        else:
            samples = await drive(front, setup, pooled, started)
        moves = [_move(entry, wall) for entry in leader.moves()[before:]]
    return Arm(name, samples, sizes, moves)


def _move(entry: dict[str, Any], wall: float) -> Move:
    t = datetime.datetime.fromisoformat(entry["time"]).timestamp() - wall
    move = entry["move"]
    return Move(t, entry["worker"], move["from"], move["to"], move["why"])


async def measure(args: argparse.Namespace, url: str, scratch: Path, setup: Setup) -> list[Arm]:
    arms = []
    for index, name in enumerate(args.arms):
        arm_url = f"{url}-{index}"  # a key prefix of its own: no record of another arm
        arms.append(await run_arm(name, arm_url, scratch / f"arm{index}", setup))
        print(f"  measured {name}" + (f": refused: {arms[-1].refused}" if arms[-1].refused else ""),
              file=sys.stderr)  # fmt: skip
    return arms


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.elastic",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--quick", action="store_true", help="shorter phases (6 / 15 / 12 s), scale down after 4 s")
    add("--arms", nargs="+", choices=ARMS, default=list(ARMS), help="which arms, in this order")
    add("--workers", type=int, default=6)
    add("--max-num-seqs", type=int, default=2, help="requests one worker serves at once")
    add("--speedup-ratio", type=float, default=0.1, help="the mocker's: 0.1 = 50 ms a step")
    add("--max-tokens", type=int, default=10, help="tokens a request streams")
    add("--slo", type=float, default=0.5, help="premium TTFT SLO, seconds")
    add("--premium-low", type=int, default=FULL.premium_low)
    add("--premium-step", type=int, default=FULL.premium_step)
    add("--batch-clients", type=int, default=FULL.batch)
    add("--target-in-flight", type=float, default=2.0)
    add("--scale-down-after", type=float, help="seconds (10; 4 with --quick)")
    add("--react", type=float, help="seconds a rise may take to be followed (5; 3 with --quick)")
    add("--seed", type=int, default=FULL.seed)
    add("--json", type=Path, help="also write every sample to this file")
    add("--results", type=Path, help="splice the section into this file, plot beside it")
    add("--from", dest="saved", type=Path, metavar="JSON",
        help="run nothing: report the run saved with --json (table, --results, plot)")  # fmt: skip
    return parser.parse_args(argv)


def setup_of(args: argparse.Namespace) -> Setup:
    shape = QUICK if args.quick else FULL
    trace = replace(
        shape,
        premium_low=args.premium_low,
        premium_step=args.premium_step,
        batch=args.batch_clients,
        seed=args.seed,
    )
    default_down, default_react = (4.0, 3.0) if args.quick else (10.0, 5.0)
    return Setup(
        workers=args.workers,
        max_num_seqs=args.max_num_seqs,
        speedup=args.speedup_ratio,
        max_tokens=args.max_tokens,
        slo_s=args.slo,
        target_in_flight=args.target_in_flight,
        scale_down_after=default_down if args.scale_down_after is None else args.scale_down_after,
        react_s=default_react if args.react is None else args.react,
        trace=trace,
    )


def command_of(argv: Sequence[str] | None) -> str:
    return shlex.join(["python", "-m", "bench.elastic", *(sys.argv[1:] if argv is None else argv)])


def loaded(document: dict[str, Any]) -> tuple[Setup, list[Arm]]:
    """The setup and the arms of a run saved with ``--json``."""
    raw = dict(document["setup"])
    setup = Setup(**{**raw, "trace": Trace(**raw["trace"])})
    arms = [
        Arm(
            name=a["name"],
            samples=[Sample(**s) for s in a["samples"]],
            sizes=[Sizes(**z) for z in a["sizes"]],
            moves=[Move(**m) for m in a["moves"]],
            refused=a["refused"],
        )
        for a in document["arms"]
    ]
    return setup, arms


def report(document: dict[str, Any], arms: list[Arm], setup: Setup, results: Path | None) -> int:
    """Print the table and the goals; splice the section and write the plot if asked."""
    summaries = [elastic_report.summarize(arm, setup) for arm in arms]
    judged = elastic_report.goals(summaries)
    print(elastic_report.text(summaries, judged, arms, setup))
    document["summaries"] = [asdict(s) for s in summaries]
    document["goals"] = [asdict(g) for g in judged]
    if results:
        elastic_report.write_results(results, document, arms, setup)
    return 1 if any(arm.refused for arm in arms) else 0


def run(args: argparse.Namespace, command: str) -> int:
    if args.saved:
        saved = json.loads(args.saved.read_text())
        setup, arms = loaded(saved)
        return report(saved, arms, setup, args.results)
    setup = setup_of(args)
    found = versions()
    t = setup.trace
    detail = (
        f"{setup.workers} mocker workers x {setup.max_num_seqs} slots on etcd; premium "
        f"{t.premium_low} -> {t.premium_step} -> {t.premium_low} clients "
        f"({t.low_s:g} / {t.step_s:g} / {t.after_s:g} s), batch {t.batch}; SLO TTFT <= "
        f"{setup.slo_s:g} s"
    )
    print(header("elastic pools", found, detail))
    before = os.getloadavg()[0]
    with places(["etcd"], bucket="elastic") as where:
        url = where.urls["etcd"]
        arms = asyncio.run(measure(args, url, where.scratch, setup))
    print(f"# load average {before:.1f} before, {os.getloadavg()[0]:.1f} after\n")
    document: dict[str, Any] = {
        "benchmark": "elastic",
        "command": command,
        "versions": found,
        "setup": asdict(setup),
        "load": [before, os.getloadavg()[0]],
        "arms": [asdict(arm) for arm in arms],
    }
    status = report(document, arms, setup, args.results)
    write_json(args.json, document)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    command = command_of(argv)
    return interruptible(lambda: run(parse(argv), command))


if __name__ == "__main__":
    sys.exit(main())
