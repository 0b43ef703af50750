"""Pool policies on etcd: convergence at 10, 1,000 and 10,000 workers, and moves made
against the fewest possible under a churn trace.

    python -m bench.pools                          # 10, 1,000 and 10,000 workers
    python -m bench.pools --sizes 1000 --churn-steps 30 --json out.json

The fleet is *registrations*, as in ``bench.scale``: this process writes the worker
records into etcd under one long lease (no 10,000 processes). Two real ``dynamod``
processes run on each fleet: the **leader** (started first; a throw-away policy on another
model makes it the leader before the second starts) and the **other** daemon, whose
router is what a request would meet. For each step:

* ``apply``: a 40/60 policy over every worker (each worker joins a pool: n moves);
* ``weights``: 40/60 -> 50/50 (a tenth of the fleet moves);
* ``join``: 1% of the fleet (at least one worker) registers at once and is placed.

``leader s`` is from the call (the apply, or the first registration) to the audit time
of the leader's last move of the step (every taint written); ``other s`` to the other
daemon's view reaching the store revision of that last move — its
``dynamod_view_revision``, which the view sets in the same watcher step that hands the
event to its router (sampled every 20 ms from ``/metrics``, so up to 20 ms late). Neither
asks the daemons for anything heavier while they work: an ``events tail`` or a ``pools
status`` per sample costs them a worker message per event or a plan per call, which at
10,000 workers is what we would be measuring. Afterwards the other daemon's ``pools
status`` must show the counts, and the leader's audit log must hold no move beyond the
fewest. ``moves`` is what the leader wrote (its audit log), ``fewest`` what the step needs
at least. The target (issue 23): ``other s`` at 1,000 workers <= 2 s.

The churn trace (``--churn-steps``, on the 1,000 fleet unless ``--churn-size``) joins and
removes (lease revoked) 1-5 workers per step and changes the weights every seventh step,
waits for each step to converge, and sums the moves the leader wrote against the fewest
for each step (``tests/pools/live.py``: every worker without a pool plus each pool's
surplus). Plan time is ``python -m bench.pools_plan``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import random
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import header, interruptible, places, render_table, versions, write_json
from dynamod.client import AsyncClient, Credentials
from dynamod.discovery.registration import register
from dynamod.pools.policy import PoolPolicy
from dynamod.store import Lease, Store, open_store
from tests.pools.live import fewest_moves, largest_remainder, pools_of
from tests.support.factories import make_record
from tests.support.processes import Proc, daemon, running

MODEL = "pools"
LEASE_TTL = 3600.0
REGISTER_CONCURRENCY = 128
SAMPLE_EVERY = 0.02
POOL_TTL = 10.0  # at least twice the store call deadline (5 s): the fence
CONVERGE_WITHIN = 120.0
HEADERS = ("workers", "step", "moves", "fewest", "leader s", "other s")
POLICY = PoolPolicy.parse(
    f"name: bench\nselector: model={MODEL}\npools:\n  pool=fast: 1\n  pool=slow: 1\n"
)


def policy_text(fast: int, slow: int, name: str = "bench", model: str = MODEL) -> str:
    return (
        f"name: {name}\nselector: model={model}\npools:\n  pool=fast: {fast}\n  pool=slow: {slow}\n"
    )


def weights(fast: int, slow: int) -> dict[str, int]:
    return {"pool=fast": fast, "pool=slow": slow}


@dataclass
class Row:
    workers: int
    step: str
    moves: int
    fewest: int
    leader_s: float
    other_s: float

    def cells(self) -> list[str]:
        timed = not self.step.startswith("churn")  # the churn row counts moves only
        times = [f"{self.leader_s:.2f}", f"{self.other_s:.2f}"] if timed else ["—", "—"]
        return [f"{self.workers:,}", self.step, f"{self.moves:,}", f"{self.fewest:,}", *times]


@dataclass
class Daemon:
    proc: Proc
    socket: Path
    offset: int = 0
    made: list[dict[str, Any]] = field(default_factory=list)
    """The moves in this daemon's audit log, read so far (as dicts)."""

    def client(self) -> AsyncClient:
        return AsyncClient(f"unix://{self.socket}", credentials=Credentials(), timeout=60)

    def moves(self) -> list[dict[str, Any]]:
        """Every move this daemon wrote, from its audit log (read from where it left off)."""
        audit = self.socket.parent / "audit.log"
        if audit.exists():
            with audit.open("rb") as log:
                log.seek(self.offset)
                chunk = log.read()
            whole = chunk[: chunk.rfind(b"\n") + 1]
            self.offset += len(whole)
            for line in whole.splitlines():
                entry = json.loads(line)
                if "move" in entry and entry["outcome"] == "ok":
                    self.made.append(entry)
        return self.made

    async def view_revision(self, http: aiohttp.ClientSession) -> int:
        """The store revision this daemon's view has reached (``/metrics``)."""
        async with http.get(self.proc.field("http") + "/metrics") as response:
            text = await response.text()
        line = next(x for x in text.splitlines() if x.startswith("dynamod_view_revision "))
        return int(float(line.split()[1]))


async def register_many(store: Store, count: int, lease: Lease) -> list[str]:
    """``count`` records of ``MODEL`` under ``lease``; their instance ids."""
    gate = asyncio.Semaphore(REGISTER_CONCURRENCY)
    ids: list[str] = []

    async def one() -> None:
        record = make_record(model=MODEL)
        async with gate:
            await register(store, record, lease)
        ids.append(record.instance_id)

    async with asyncio.TaskGroup() as group:
        for _ in range(count):
            group.create_task(one())
    return ids


async def start_daemon(
    stack: contextlib.AsyncExitStack, url: str, scratch: Path, name: str
) -> Daemon:
    directory = scratch / name
    directory.mkdir(parents=True)
    socket = directory / "d.sock"
    proc = daemon(url, socket, "--replica-id", name, DYNAMO_POOL_LEASE_TTL=str(POOL_TTL))
    await stack.enter_async_context(running(proc))
    return Daemon(proc, socket)


async def both(
    f: Fleet, act: Callable[[], Awaitable[Any]], wanted: dict[str, int], fewest: int
) -> tuple[float, float, int]:
    """Do ``act``; seconds until the leader's last move (of ``fewest``) and until the other
    daemon's view has it; and the moves the leader made (see the module docstring)."""
    first = len(f.leader.moves())
    started_at, started = time.time(), time.perf_counter()
    await act()
    await _until(_now(lambda: len(f.leader.moves()) - first), lambda n: n >= fewest)
    mine = f.leader.moves()[first:]
    last = max((m["revision"] for m in mine), default=0)
    leader_s = max((_epoch(m["time"]) - started_at for m in mine), default=0.0)
    async with aiohttp.ClientSession() as http:
        await _until(lambda: f.other.view_revision(http), lambda r: r >= last)
    other_s = time.perf_counter() - started
    status = await _until(lambda: f.oc.pool_status("bench"), lambda s: s.balanced)
    assert {c.pool: c.actual for c in status.pools} == wanted, (status.pools, wanted)
    await asyncio.sleep(0.5)  # a move beyond the fewest would be in the audit log by now
    return leader_s, other_s, len(f.leader.moves()) - first


def _epoch(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp).timestamp()


async def join(
    store: Store, count: int, lease: Lease, joined: list[str], leases: dict[str, Lease]
) -> None:
    """Register ``count`` workers on ``lease``; note them in ``joined`` and ``leases``."""
    joined.extend(await register_many(store, count, lease))
    leases.update(dict.fromkeys(joined, lease))


async def held(client: AsyncClient) -> dict[str, str | None]:
    policy = PoolPolicy.parse(policy_text(1, 1))
    workers, _ = await client.list_workers(model=MODEL, fields=("id", "taints", "model"))
    return pools_of(workers, policy)


@dataclass
class Fleet:
    size: int
    store: Store
    leader: Daemon
    other: Daemon
    lc: AsyncClient
    oc: AsyncClient


@contextlib.asynccontextmanager
async def fleet_of(size: int, endpoint: str, scratch: Path) -> AsyncIterator[Fleet]:
    """``size`` registered workers and two daemons, in a key prefix of their own."""
    url = f"etcd://{endpoint}/pools-{size}-{scratch.name}"
    async with contextlib.AsyncExitStack() as stack:
        store = await stack.enter_async_context(await open_store(url))
        await register_many(store, size, await store.grant(LEASE_TTL))
        leader = await start_daemon(stack, url, scratch / f"n{size}", "leader")
        lc = await stack.enter_async_context(leader.client())
        await lc.apply_policy(policy_text(1, 1, name="warm", model="nobody"))
        await _until(lambda: lc.pool_status("warm"), lambda s: s.leading)
        other = await start_daemon(stack, url, scratch / f"n{size}", "other")
        oc = await stack.enter_async_context(other.client())
        yield Fleet(size, store, leader, other, lc, oc)


async def _until(sample: Callable[[], Awaitable[Any]], accept: Callable[[Any], bool]) -> Any:
    async with asyncio.timeout(120):
        while True:
            value = await sample()
            if accept(value):
                return value
            await asyncio.sleep(SAMPLE_EVERY)


async def convergence(size: int, endpoint: str, scratch: Path) -> list[Row]:
    rows = []
    async with fleet_of(size, endpoint, scratch) as f:

        async def step(
            name: str, act: Callable[[], Awaitable[Any]], n: int, ratio: tuple[int, int]
        ) -> None:
            counts = largest_remainder(n, weights(*ratio))
            now = await held(f.oc)
            fewest = fewest_moves({**now, **dict.fromkeys(joining)}, counts)
            leader_s, other_s, made = await both(f, act, counts, fewest)
            rows.append(Row(size, name, made, fewest, leader_s, other_s))

        joining: list[str] = []
        await step("apply 40/60", partial(f.oc.apply_policy, policy_text(40, 60)), size, (40, 60))
        to_half = partial(f.oc.apply_policy, policy_text(50, 50))
        await step("40/60 -> 50/50", to_half, size, (50, 50))
        count = max(1, size // 100)
        joining += [f"new-{i}" for i in range(count)]  # unplaced, for the fewest
        lease = await f.store.grant(LEASE_TTL)
        adding = partial(join, f.store, count, lease, [], {})
        await step(f"join {count}", adding, size + count, (50, 50))
    return rows


def _now(call: Callable[[], int]) -> Callable[[], Awaitable[int]]:
    async def sample() -> int:
        return call()

    return sample


async def churn(size: int, steps: int, endpoint: str, scratch: Path, seed: int) -> Row:
    rng = random.Random(seed)
    async with fleet_of(size, endpoint, scratch / "churn") as f:
        leases: dict[str, Lease] = {}
        ratio = (40, 60)
        n = size
        first = partial(f.oc.apply_policy, policy_text(*ratio))
        await both(f, first, largest_remainder(size, weights(*ratio)), size)
        fewest = made = 0
        for step in range(steps):
            now = await held(f.lc)
            joined: list[str] = []
            act: Callable[[], Awaitable[Any]]
            if step % 7 == 6:
                ratio = (ratio[1], ratio[0])
                act = partial(f.oc.apply_policy, policy_text(*ratio))
            elif step % 2 == 0 or not leases:
                count = rng.randint(1, 5)
                n += count
                joined = [f"new-{i}" for i in range(count)]
                lease = await f.store.grant(LEASE_TTL)
                act = partial(join, f.store, count, lease, [], leases)
            else:
                lease = leases[rng.choice(sorted(leases))]
                gone = [i for i, held_by in leases.items() if held_by == lease]
                for ident in gone:
                    del leases[ident]
                    del now[ident]
                n -= len(gone)
                act = partial(f.store.revoke, lease)
            counts = largest_remainder(n, weights(*ratio))
            needed = fewest_moves({**now, **dict.fromkeys(joined)}, counts)
            fewest += needed
            made += (await both(f, act, counts, needed))[2]
    return Row(size, f"churn, {steps} steps", made, fewest, 0.0, 0.0)


async def measure(args: argparse.Namespace, endpoint: str, scratch: Path) -> list[Row]:
    rows: list[Row] = []
    for size in args.sizes:
        rows += await convergence(size, endpoint, scratch / f"c{size}")
        print(f"  measured {size:,} workers", file=sys.stderr)
    if args.churn_steps:
        rows.append(await churn(args.churn_size, args.churn_steps, endpoint, scratch, args.seed))
    return rows


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.pools", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 1_000, 10_000])
    parser.add_argument("--churn-steps", type=int, default=28)
    parser.add_argument("--churn-size", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    found = versions()
    detail = (
        f"registered fleets of {', '.join(f'{s:,}' for s in args.sizes)} workers on etcd, "
        f"two dynamods each (pool lease {POOL_TTL:g} s); churn: {args.churn_steps} steps "
        f"on {args.churn_size:,}"
    )
    print(header("pool policies", found, detail))
    with places(["etcd"], bucket="pools") as where:
        rows = asyncio.run(measure(args, where.etcd_endpoint or "", where.scratch))
    print(render_table(HEADERS, [r.cells() for r in rows]))
    write_json(
        args.json,
        {"benchmark": "pools", "versions": found, "rows": [r.__dict__ for r in rows]},
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return interruptible(lambda: run(parse(argv)))


if __name__ == "__main__":
    sys.exit(main())
