"""Load with moving taints: requests through dynamod's front while workers change pools.

    python -m bench.load                                # etcd, 4 workers, 2 x 15 s at 60 req/s
    python -m bench.load --backend nats --rate 100 --flip-rate 10 --json out.json

A real ``dynamod`` fronts ``--workers`` mocker workers (``dynamo-worker``, fast speed-up
ratio) on a real store. Each worker holds ``pool=a`` or ``pool=b``, half of them also
``capacity/fast``. Requests arrive open-loop at ``--rate`` per second, each drawn from a
mix of constraints (``MIX``: required pools, required pool and capacity, a preferred pool,
none). The run has two phases of ``--duration`` seconds: *steady* (no taint changes, the
baseline) and *flipping*, where a flipper moves one worker at a time to the other pool
through the worker's own route, ``POST /engine/update/model_taints``, ``--flip-rate`` times
a second, never emptying a pool. Each request's outcome, latency and chosen worker (the
``x-dynamo-worker-id`` header) are recorded and judged.

How "at dispatch time" is decided
---------------------------------
The load generator runs its own ``WorkerView`` on the same store (``TaintLog``): every
state each worker's taints went through, stamped with ``time.monotonic_ns()`` when this
view applied it, with its store revision. The router's decision for a request happens at
an unknown moment between sending it (``sent``) and its answer (``done``), on the
daemon's view, which applies each store revision at nearly the same moment as ours (both
watch the same store; ``bench.propagation`` puts that delay well under a millisecond at
p50, a few ms at p99 on a busy box). So a request is judged against every state its worker
held in our log during the *uncertainty window* ``[sent - slack, done + slack]``
(``--slack-ms``, 50 ms by default, covering the skew between the two views):

* ``honoured``: every state in the window satisfies the request's required taints;
* ``honoured in window``: some do: a change landed inside the window, so either state
  may be the one the router used, and one of them was right;
* ``violated``: none does, or the worker is unknown to the log. Any is a failure.

A refusal (``503 no_eligible_worker``, or ``404 model_not_found`` when the model has no
worker at all) is ``justified`` when at some moment of its window no worker in the log
satisfied the request, ``unjustified`` otherwise (a failure). Other answers are
counted by status and error code, or by exception when no answer came (daemon down).

At the end every worker's taints in the daemon's view (``ListWorkers``), in our view and
in the flipper's last acknowledged write must agree: no lost update. The exit status is 1
when anything failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from bench.common import (
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
from bench.taintlog import SETTLE_TIMEOUT, TaintLog, taint_log
from dynamod.client import AsyncClient
from dynamod.http.openai import WORKER_ID_HEADER
from dynamod.store import open_store
from dynamod.taints import RoutingConstraints, caller_taints, key_of, matches
from tests.support.processes import Proc, daemon, worker

MODEL = "load"
POOLS = ("pool=a", "pool=b")
FAST = "capacity/fast"
WORDS = (
    "the", "quiet", "river", "runs", "north", "under", "an", "old", "stone", "bridge", "past",
    "seven", "tall", "oaks",
)  # fmt: skip
REQUEST_TIMEOUT = 20.0


# -- what requests ask for ---------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """One entry of the request mix."""

    name: str
    weight: float
    constraints: RoutingConstraints

    def nvext(self) -> dict[str, Any]:
        return {"routing_constraints": self.constraints.to_json()}


def _required(*taints: str) -> RoutingConstraints:
    return RoutingConstraints(required_taints=frozenset(taints))


MIX = (
    Kind("pool a", 3, _required("pool=a")),
    Kind("pool b", 3, _required("pool=b")),
    Kind("fast in a", 1, _required(FAST, "pool=a")),
    Kind("prefer b", 1, RoutingConstraints(preferred_taints={"pool=b": 0.9})),
    Kind("any", 2, RoutingConstraints()),
)


def initial_taints(index: int, count: int) -> tuple[str, ...]:
    """Alternate pools; the first half is fast, so every pool starts with a fast worker."""
    return (POOLS[index % 2], *((FAST,) if index < max(count // 2, 1) else ()))


# -- requests ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """One request: what it asked, when, and what came back."""

    kind: Kind
    sent_ns: int
    done_ns: int
    status: int | None  # None: no HTTP answer at all
    worker_id: str | None
    code: str  # the error code of an error answer, the exception name without one

    @property
    def latency_ns(self) -> int:
        return self.done_ns - self.sent_ns


def _body(kind: Kind, rng: random.Random) -> dict[str, Any]:
    return {
        "model": MODEL,
        "prompt": " ".join(rng.choices(WORDS, k=12)),
        "max_tokens": 4,
        "nvext": kind.nvext(),
    }


async def send(http: aiohttp.ClientSession, url: str, kind: Kind, body: dict[str, Any]) -> Outcome:
    """One completion; never raises for a failed request, only records it."""
    sent = time.monotonic_ns()
    try:
        async with http.post(url, json=body) as response:
            raw = await response.read()
            status, worker_id = response.status, response.headers.get(WORKER_ID_HEADER)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Outcome(kind, sent, time.monotonic_ns(), None, None, type(exc).__name__)
    return Outcome(kind, sent, time.monotonic_ns(), status, worker_id, _error_code(raw))


def _error_code(raw: bytes) -> str:
    try:
        error = json.loads(raw).get("error")
    except (ValueError, AttributeError):
        return ""
    return str(error.get("code") or "") if isinstance(error, dict) else ""


class LoadGenerator:
    """Open-loop requests at ``rate`` per second until ``stop`` is set; see the module
    docstring. ``outcomes`` fills as answers arrive."""

    def __init__(
        self, front_url: str, *, rate: float, mix: Sequence[Kind] = MIX, seed: int = 1
    ) -> None:
        self.url = front_url.rstrip("/") + "/v1/completions"
        self.rate = rate
        self.mix = mix
        self.rng = random.Random(seed)
        self.outcomes: list[Outcome] = []

    async def run(self, stop: asyncio.Event) -> None:
        """Send until ``stop`` is set, then wait for the requests in flight."""
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
        connector = aiohttp.TCPConnector(limit=0)
        async with (
            aiohttp.ClientSession(timeout=timeout, connector=connector) as http,
            asyncio.TaskGroup() as group,
        ):
            start = time.monotonic()
            for index in range(sys.maxsize):
                # Pacing to an absolute schedule: a late tick does not shift later ones.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(_loop_time(start + index / self.rate)):
                        await stop.wait()
                if stop.is_set():
                    break
                group.create_task(self._one(http))

    async def _one(self, http: aiohttp.ClientSession) -> None:
        kind = self.rng.choices(self.mix, weights=[k.weight for k in self.mix])[0]
        self.outcomes.append(await send(http, self.url, kind, _body(kind, self.rng)))


def _loop_time(monotonic: float) -> float:
    """A ``time.monotonic()`` moment on the event loop's clock (the same clock on Linux,
    but the loop may use another)."""
    loop = asyncio.get_running_loop()
    return loop.time() + (monotonic - time.monotonic())


# -- moving workers between pools ----------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A worker the flipper may move: its store key and its system server's URL."""

    key: str
    system_url: str

    @classmethod
    def of(cls, proc: Proc) -> Target:
        return cls(proc.field("key"), proc.field("system"))


Move = tuple[str, tuple[str, ...]]
"""A worker's key and the caller taints it acknowledged."""


@dataclass
class Flips:
    ok: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    acknowledged: dict[str, tuple[str, ...]] = field(default_factory=dict)
    unknown: set[str] = field(default_factory=set)  # last write's outcome unknown
    acked_ns: list[int] = field(default_factory=list)  # when each move was acknowledged


def _other_pool(taints: Iterable[str]) -> tuple[str, ...]:
    held = caller_taints(taints)
    pool = next((t for t in held if key_of(t) == "pool"), POOLS[1])
    moved = POOLS[0] if pool == POOLS[1] else POOLS[1]
    return tuple(sorted({*(t for t in held if key_of(t) != "pool"), moved}))


class Flipper:
    """Moves one worker to the other pool ``rate`` times a second, never emptying a pool
    (judged on ``log``'s current view), through the worker's taint route."""

    def __init__(self, targets: Sequence[Target], log: TaintLog, *, rate: float, seed: int = 2):
        self.targets = {t.key: t for t in targets}
        self.log = log
        self.rate = rate
        self.rng = random.Random(seed)
        self.flips = Flips()

    async def run(self, stop: asyncio.Event) -> None:
        async with self._session() as http:
            while not stop.is_set():
                await self._flip_one(http)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1 / self.rate):
                        await stop.wait()

    async def flip_once(self) -> Move | None:
        """One move, outside ``run``: the worker's key and the taints it acknowledged."""
        async with self._session() as http:
            return await self._flip_one(http)

    def _session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT))

    def _movable(self) -> list[str]:
        fleet = {k: t for k, t in self.log.current().items() if k in self.targets}
        members = Counter(p for t in fleet.values() for p in t if p in POOLS)
        return sorted(k for k, t in fleet.items() if all(members[p] >= 2 for p in t if p in POOLS))

    async def _flip_one(self, http: aiohttp.ClientSession) -> Move | None:
        movable = self._movable()
        if not movable:
            return None
        key = self.rng.choice(movable)
        wanted = _other_pool(self.log.current()[key])
        url = self.targets[key].system_url + "/engine/update/model_taints"
        try:
            async with http.post(url, json={"taints": list(wanted)}) as response:
                body = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self.flips.failed[type(exc).__name__] += 1
            self.flips.unknown.add(key)  # it may or may not have been written
            return None
        if response.status != 200:
            self.flips.failed[f"HTTP {response.status}"] += 1
            # A 503 from a store outage may have written; 4xx never did.
            if response.status >= 500:
                self.flips.unknown.add(key)
            return None
        return self._acknowledged(key, tuple(body["taints"]))

    def _acknowledged(self, key: str, taints: tuple[str, ...]) -> Move:
        self.flips.ok += 1
        self.flips.acknowledged[key] = taints
        self.flips.acked_ns.append(time.monotonic_ns())
        self.flips.unknown.discard(key)
        return key, taints


# -- judging -----------------------------------------------------------------------------------

VERDICTS = (
    "honoured",
    "honoured in window",
    "violated",
    "refused, justified",
    "refused, unjustified",
)
FAILURES = ("violated", "refused, unjustified")
REFUSALS = {503: "no_eligible_worker", 404: "model_not_found"}


def verdict(outcome: Outcome, log: TaintLog, slack_ns: int) -> str:
    """The verdict on one request (see the module docstring); other answers are named by
    status and code, or by the exception when nothing came back."""
    # Before the log's first snapshot nothing is known: the window starts there at the most.
    start = max(outcome.sent_ns - slack_ns, log.started_ns or 0)
    end = outcome.done_ns + slack_ns
    constraints = outcome.kind.constraints
    if outcome.status == 200:
        key = log.key_of(outcome.worker_id or "")
        if key is None:
            return "violated"
        fits = [t is not None and matches(t, constraints) for t in log.states(key, start, end)]
        if all(fits):
            return "honoured"
        return "honoured in window" if any(fits) else "violated"
    if outcome.status in REFUSALS and outcome.code == REFUSALS[outcome.status]:
        # 404: no worker of the model at all, so no constraints can be met.
        wanted = constraints if outcome.status == 503 else RoutingConstraints()
        justified = log.nobody_satisfied(wanted, start, end)
        return "refused, justified" if justified else "refused, unjustified"
    if outcome.status is None:
        return f"no answer ({outcome.code})"
    return f"HTTP {outcome.status} {outcome.code}".rstrip()


@dataclass(frozen=True)
class Judgement:
    verdicts: Counter[str]
    failures: list[str]  # a line per failed request
    latency: Stats | None  # of the 200 answers

    @property
    def ok(self) -> bool:
        return not self.failures


def judge(outcomes: Sequence[Outcome], log: TaintLog, *, slack_ms: float) -> Judgement:
    verdicts: Counter[str] = Counter()
    failures = []
    for outcome in outcomes:
        said = verdict(outcome, log, int(slack_ms * 1e6))
        verdicts[said] += 1
        if said in FAILURES:
            failures.append(f"{said}: {outcome.kind.name} served by {outcome.worker_id}")
    answered = [o.latency_ns for o in outcomes if o.status == 200]
    return Judgement(verdicts, failures, Stats.of(answered) if answered else None)


# -- the end state ---------------------------------------------------------------------------


async def daemon_caught_up(client: AsyncClient, revision: int) -> None:
    """Wait until the daemon's view has reached ``revision`` (its event stream says so)."""
    # Closed at once, not left to the garbage collector: the stream ends while quiet.
    async with asyncio.timeout(SETTLE_TIMEOUT), contextlib.aclosing(client.tail_events()) as tail:
        async for event in tail:
            if event.revision >= revision:
                return


async def lost_updates(client: AsyncClient, log: TaintLog, flips: Flips) -> list[str]:
    """Where the daemon's view, this view and the last acknowledged flips disagree."""
    store_state = log.current()
    await daemon_caught_up(client, max(c.revision for c in log.changes))
    workers, _ = await client.list_workers(model=MODEL)
    daemon_state = {w.record.key: frozenset(w.record.taints) for w in workers}
    problems = []
    if set(daemon_state) != set(store_state):
        problems.append(f"daemon sees {sorted(daemon_state)}, the store {sorted(store_state)}")
    for key, taints in store_state.items():
        if daemon_state.get(key, taints) != taints:
            problems.append(
                f"{key}: daemon has {sorted(daemon_state[key])}, store {sorted(taints)}"
            )
        acked = flips.acknowledged.get(key)
        if acked is not None and key not in flips.unknown and caller_taints(taints) != acked:
            problems.append(f"{key}: last acknowledged flip {acked}, store {sorted(taints)}")
    return problems


class Runner(Protocol):
    async def run(self, stop: asyncio.Event) -> None: ...


@contextlib.asynccontextmanager
async def running(*runners: Runner) -> AsyncIterator[asyncio.Event]:
    """Run ``x.run(stop)`` for each runner for the body of the ``async with``; on exit set
    ``stop`` and wait for them to finish (a generator lets its requests in flight end)."""
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        for runner in runners:
            group.create_task(runner.run(stop), name=f"{type(runner).__name__}.run")
        try:
            yield stop
        finally:
            stop.set()


# -- the benchmark -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    name: str
    judgement: Judgement
    flips: Flips | None
    seconds: float
    sent: int

    def cells(self) -> list[str]:
        j, lat = self.judgement, self.judgement.latency
        others = sum(n for v, n in j.verdicts.items() if v not in VERDICTS)
        return [
            self.name,
            str(self.sent),
            f"{self.sent / self.seconds:.1f}",
            *(str(j.verdicts[v]) for v in VERDICTS),
            str(others),
            str(self.flips.ok if self.flips else 0),
            ms(lat.p50_ms if lat else None),
            ms(lat.p99_ms if lat else None),
        ]

    def json(self) -> dict[str, Any]:
        flips = self.flips or Flips()
        return {
            "phase": self.name,
            "sent": self.sent,
            "seconds": self.seconds,
            "verdicts": dict(self.judgement.verdicts),
            "failures": self.judgement.failures[:20],
            "latency": stats_json(self.judgement.latency),
            "flips_ok": flips.ok,
            "flips_failed": dict(flips.failed),
        }


HEADERS = (
    "phase", "sent", "req/s", *VERDICTS, "other", "flips", "ok p50 ms", "ok p99 ms",
)  # fmt: skip


@dataclass(frozen=True)
class Config:
    backend: str
    workers: int
    rate: float
    flip_rate: float
    duration: float
    slack_ms: float


async def phase(
    name: str, cfg: Config, front: str, log: TaintLog, targets: Sequence[Target], flip: bool
) -> Phase:
    load = LoadGenerator(front, rate=cfg.rate, seed=len(name))
    flipper = Flipper(targets, log, rate=cfg.flip_rate) if flip else None
    started = time.monotonic()
    async with running(load, *([flipper] if flipper else [])):
        await asyncio.sleep(cfg.duration)  # the phase's length is the point of the wait
    seconds = time.monotonic() - started
    judgement = judge(load.outcomes, log, slack_ms=cfg.slack_ms)
    return Phase(name, judgement, flipper.flips if flipper else None, seconds, len(load.outcomes))


async def start_all(procs: Sequence[Proc]) -> None:
    async with asyncio.TaskGroup() as group:
        for proc in procs:
            group.create_task(proc.start())


async def measure(cfg: Config, url: str, scratch: Path) -> tuple[list[Phase], list[str]]:
    procs = [
        worker(url, "--speedup-ratio", "1000", *_flags(initial_taints(i, cfg.workers)), model=MODEL)
        for i in range(cfg.workers)
    ]
    dynamod = daemon(url, scratch / "dynamod.sock")
    async with contextlib.AsyncExitStack() as stack:
        for proc in (*procs, dynamod):
            stack.push_async_callback(proc.kill)
        await start_all([*procs, dynamod])
        store = await stack.enter_async_context(await open_store(url))
        log, view = await stack.enter_async_context(taint_log(store))
        await view.wait_for(lambda v: len(v) == cfg.workers, within=SETTLE_TIMEOUT)
        client = await stack.enter_async_context(AsyncClient(f"unix://{scratch / 'dynamod.sock'}"))
        front, targets = dynamod.field("http"), [Target.of(p) for p in procs]
        steady = await phase("steady", cfg, front, log, targets, flip=False)
        flipping = await phase("flipping", cfg, front, log, targets, flip=True)
        assert flipping.flips is not None
        return [steady, flipping], await lost_updates(client, log, flipping.flips)


def _flags(taints: Iterable[str]) -> list[str]:
    return [flag for t in taints for flag in ("--taint", t)]


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__)
    parser.add_argument("--backend", choices=("file", "etcd", "nats"), default="etcd")
    parser.add_argument("--workers", type=int, default=4, help="mocker worker processes")
    parser.add_argument("--rate", type=float, default=60.0, help="requests per second")
    parser.add_argument("--flip-rate", type=float, default=5.0, help="pool moves per second")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per phase")
    parser.add_argument("--slack-ms", type=float, default=50.0, help="uncertainty slack")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.workers < 2:
        parser.error(f"--workers {args.workers} must be at least 2 (one per pool)")
    for name in ("rate", "flip_rate", "duration"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)} must be positive")
    return args


def run(args: argparse.Namespace) -> int:
    cfg = Config(
        args.backend, args.workers, args.rate, args.flip_rate, args.duration, args.slack_ms
    )
    found = versions()
    detail = (
        f"{cfg.workers} mocker workers on {cfg.backend}, {cfg.rate:g} req/s open-loop, "
        f"{cfg.duration:g} s steady then {cfg.duration:g} s with {cfg.flip_rate:g} pool "
        f"moves/s, slack {cfg.slack_ms:g} ms"
    )
    print(header("load with moving taints", found, detail))
    with places([cfg.backend]) as where:
        phases, lost = asyncio.run(measure(cfg, where.urls[cfg.backend], where.scratch))
    print(render_table(HEADERS, [p.cells() for p in phases]))
    failed = [f for p in phases for f in p.judgement.failures] + lost
    for line in [*failed[:20], *(["..."] if len(failed) > 20 else [])]:
        print(f"FAIL {line}")
    print("PASS: every request honoured its constraints, no update lost" if not failed else "")
    write_json(
        args.json,
        {
            "benchmark": "load",
            "versions": found,
            "config": vars(cfg),
            "phases": [p.json() for p in phases],
            "lost_updates": lost,
            "passed": not failed,
        },
    )
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    return interruptible(lambda: run(parse(argv)))


if __name__ == "__main__":
    sys.exit(main())
