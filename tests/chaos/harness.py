"""A small cluster for fault tests: mocker workers and one dynamod as real processes, a
``TaintLog`` of the store, a gRPC client, and load from ``bench.load`` aimed at the front.

Every scenario ends with the same three questions, answered here:

* was any request routed against the constraints that held at dispatch time
  (``bench.load.judge``: nothing ``violated``, no unjustified refusal)?
* was any taint update lost (``bench.load.lost_updates``: the daemon's view, the store
  and the last acknowledged flips agree)?
* is a worker that is gone still in the daemon's view?
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench.load import (
    MODEL,
    VERDICTS,
    Flipper,
    Flips,
    Judgement,
    LoadGenerator,
    Outcome,
    Target,
    initial_taints,
    judge,
    lost_updates,
    running,
    start_all,
    verdict,
)
from bench.taintlog import TaintLog, taint_log
from dynamod.client import AsyncClient
from dynamod.discovery.view import WorkerView
from dynamod.store import open_store
from tests.support.processes import Proc, daemon_argv, worker
from tests.support.servers import free_port

SLACK_MS = 100.0  # generous: a 2-core CI box running a cluster and the load at once
SETTLE = 30.0
RETRY = 0.2
FIGURES_ENV = "DYNAMO_CHAOS_FIGURES"


class Figures:
    """What a scenario measured, by name (see ``conftest.figures``)."""

    def __init__(self) -> None:
        self.values: dict[str, object] = {}

    def record(self, name: str, value: object) -> None:
        self.values[name] = value


@dataclass
class Cluster:
    """The processes of one scenario and this test's view of the store."""

    store_url: str
    socket: Path
    http_port: int
    workers: list[Proc]
    dynamod: Proc
    log: TaintLog
    view: WorkerView
    client: AsyncClient
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def front(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def targets(self) -> list[Target]:
        return [Target.of(p) for p in self.workers]

    def new_dynamod(self) -> Proc:
        """A ``dynamod`` on this cluster's store, socket and HTTP port (not started)."""
        return dynamod_proc(self.store_url, self.socket, self.http_port, **self.extra_env)

    async def restart_dynamod(self) -> None:
        self.dynamod = await self.new_dynamod().start()

    async def metric(self, name: str) -> float:
        """The sum of a counter's samples on the daemon's ``/metrics``."""
        async with aiohttp.ClientSession() as http, http.get(self.front + "/metrics") as reply:
            text = await reply.text()
        return sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == name
        )

    async def settled(self, flips: Flips | None = None) -> list[str]:
        """Lost updates and stale workers, once the daemon caught up with the store."""
        return await lost_updates(self.client, self.log, flips or Flips())


def dynamod_proc(store_url: str, socket: Path, http_port: int, **env: str) -> Proc:
    argv = daemon_argv(store_url, socket)
    argv[argv.index("--http") + 1] = f"127.0.0.1:{http_port}"  # fixed: it survives restarts
    return Proc(argv, r"^dynamod ready:", env)


@contextlib.asynccontextmanager
async def cluster(
    store_url: str,
    tmp_path: Path,
    *,
    workers: int = 3,
    worker_args: Sequence[str] = (),
    **env: str,
) -> AsyncIterator[Cluster]:
    """``workers`` mocker workers (pools and capacity from ``bench.load.initial_taints``,
    lease TTL 2 s unless ``worker_args`` say otherwise) and a dynamod, all started; the log
    synced with every worker in it."""
    procs = [
        worker(
            store_url,
            "--speedup-ratio", "1000",
            *worker_args,
            *(f for t in initial_taints(i, workers) for f in ("--taint", t)),
            model=MODEL,
        )
        for i in range(workers)
    ]  # fmt: skip
    socket = tmp_path / "dynamod.sock"
    first = dynamod_proc(store_url, socket, free_port(), **env)
    async with contextlib.AsyncExitStack() as stack:
        for proc in (*procs, first):
            stack.push_async_callback(proc.kill)
        await start_all(procs)
        await first.start()
        store = await stack.enter_async_context(await open_store(store_url))
        log, view = await stack.enter_async_context(taint_log(store))
        await view.wait_for(lambda v: len(v) == workers, within=SETTLE)
        client = await stack.enter_async_context(AsyncClient(f"unix://{socket}", timeout=5))
        port = int(first.field("http").rpartition(":")[2])
        found = Cluster(store_url, socket, port, procs, first, log, view, client, dict(env))
        stack.push_async_callback(lambda: found.dynamod.kill())  # the one after restarts
        yield found


@contextlib.asynccontextmanager
async def loaded(
    c: Cluster, *, rate: float = 40.0, flip_rate: float | None = 4.0
) -> AsyncIterator[tuple[LoadGenerator, Flipper | None]]:
    """Requests at ``rate`` per second on the front and, unless ``flip_rate`` is None, pool
    moves through the workers' routes, for the body of the ``async with``."""
    load = LoadGenerator(c.front, rate=rate)
    flipper = Flipper(c.targets(), c.log, rate=flip_rate) if flip_rate else None
    async with running(load, *([flipper] if flipper else [])):
        yield load, flipper


def judged(outcomes: Sequence[Outcome], log: TaintLog) -> Judgement:
    """The verdicts, asserting that no request was routed against its constraints."""
    judgement = judge(outcomes, log, slack_ms=SLACK_MS)
    assert judgement.ok, "\n".join(judgement.failures[:20])
    return judgement


def unanswered(outcomes: Sequence[Outcome], log: TaintLog) -> list[str]:
    """Requests that got neither a 200 nor a justified refusal, one line each."""
    slack = int(SLACK_MS * 1e6)
    said = ((o, verdict(o, log, slack)) for o in outcomes)
    return [f"{o.kind.name} at {o.sent_ns}: {v}" for o, v in said if v not in VERDICTS]


def sent_between(outcomes: Sequence[Outcome], start_ns: int, end_ns: int) -> list[Outcome]:
    return [o for o in outcomes if start_ns <= o.sent_ns < end_ns]


async def flip_acknowledged(c: Cluster, flipper: Flipper) -> None:
    """One more pool move that a worker acknowledges, and this view shows.

    Right after a store restart a worker's store client may still be reconnecting and
    answer 503: the move is retried, a few times a second, under the settle deadline.
    """
    for _ in range(int(SETTLE / RETRY)):
        sent = time.monotonic_ns()
        move = await flipper.flip_once()
        if move is not None:
            break
        await asyncio.sleep(RETRY)
    else:
        raise AssertionError(f"no worker acknowledged a pool move within {SETTLE} s")
    key, taints = move
    # In the log, not the view: the running flipper may move that worker again at once.
    await c.view.wait_for(lambda _: c.log.held_since(key, taints, sent), within=SETTLE)
