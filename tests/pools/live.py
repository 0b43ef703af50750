"""Real processes for the pool tests: dynamod daemons with a short pool lease, mocker
workers, their audit logs, and the largest-remainder arithmetic a test checks the leader
against (written here again, on purpose, not imported from ``dynamod.pools``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from dynamod.client import AsyncClient, Credentials
from dynamod.pools.plan import held_pools
from dynamod.pools.policy import PoolPolicy
from dynamod.results import WorkerInfo
from tests.support.eventually import eventually
from tests.support.processes import Proc, daemon, worker

POOL_TTL = 2.0
"""The pool leader's lease in these tests (``pool_lease_ttl``), and the workers' own."""
STORE_TIMEOUT = POOL_TTL / 2
"""The daemons' store call deadline: a lease this short needs one at most half of it."""
WORKER_TTL = 2.0
MODEL = "llama"


SOCKET = "d.sock"
"""A test daemon's socket, in its own directory beside its ``audit.log``."""


def pool_daemon(store_url: str, directory: Path, name: str, **settings: str) -> Proc:
    """A dynamod named ``name``, its socket (``SOCKET``) and audit log in ``directory`` (made
    here), with these tests' pool lease and store deadline; ``settings``: more ``DYNAMO_*``
    variables. Not started yet."""
    directory.mkdir(parents=True)
    return daemon(
        store_url, directory / SOCKET, "--replica-id", name,
        DYNAMO_POOL_LEASE_TTL=str(POOL_TTL), DYNAMO_STORE_TIMEOUT=str(STORE_TIMEOUT), **settings,
    )  # fmt: skip


def policy_text(fast: int, slow: int, name: str = "split") -> str:
    return (
        f"name: {name}\nselector: model={MODEL}\npools:\n  pool=fast: {fast}\n  pool=slow: {slow}\n"
    )


def largest_remainder(n: int, weights: Mapping[str, int]) -> dict[str, int]:
    """Hamilton's method, ties by taint: the counts the policy must reach."""
    total = sum(weights.values())
    quotas = {t: Fraction(n * w, total) for t, w in sorted(weights.items())}
    counts = {t: math.floor(q) for t, q in quotas.items()}
    left = n - sum(counts.values())
    for taint in sorted(quotas, key=lambda t: (counts[t] - quotas[t], t))[:left]:
        counts[taint] += 1
    return counts


def fewest_moves(held: Mapping[str, str | None], wanted: Mapping[str, int]) -> int:
    """The fewest moves from ``held`` (worker -> its one pool, or None) to ``wanted``:
    every worker without a pool, plus each pool's surplus."""
    have = dict.fromkeys(wanted, 0)
    unplaced = 0
    for pool in held.values():
        if pool is None:
            unplaced += 1
        else:
            have[pool] += 1
    return unplaced + sum(max(0, have[p] - wanted[p]) for p in wanted)


@dataclass
class Daemon:
    name: str
    proc: Proc
    socket: Path

    @property
    def audit_log(self) -> Path:
        return self.socket.parent / "audit.log"

    @property
    def front(self) -> str:
        return self.proc.field("http")

    def client(self) -> AsyncClient:
        return AsyncClient(f"unix://{self.socket}", credentials=Credentials(), timeout=20)

    def moves(self) -> list[dict[str, Any]]:
        """The pool moves this daemon wrote, from its audit log."""
        if not self.audit_log.exists():
            return []
        lines = [json.loads(line) for line in self.audit_log.read_text().splitlines()]
        return [line for line in lines if "move" in line and line["outcome"] == "ok"]


@dataclass
class Fleet:
    """Daemons and mocker workers on one store, stopped (SIGKILL) on exit."""

    store_url: str
    root: Path
    daemons: list[Daemon] = field(default_factory=list)
    workers: dict[str, Proc] = field(default_factory=dict)
    """By instance id."""

    async def start_daemon(self, name: str) -> Daemon:
        proc = pool_daemon(self.store_url, self.root / name, name)
        await proc.start(within=60)
        started = Daemon(name, proc, self.root / name / SOCKET)
        self.daemons.append(started)
        return started

    async def start_workers(self, count: int, *args: str) -> list[str]:
        """``count`` mocker workers; ``args``: more ``dynamo-worker`` options."""
        procs = [
            worker(self.store_url, "--lease-ttl", str(WORKER_TTL), *args) for _ in range(count)
        ]
        await asyncio.gather(*(p.start(within=60) for p in procs))
        for proc in procs:
            self.workers[proc.field("id")] = proc
        return [p.field("id") for p in procs]

    async def kill_workers(self, ids: Iterable[str]) -> None:
        for ident in list(ids):
            await self.workers.pop(ident).kill()

    async def stop_workers(self, ids: Iterable[str]) -> None:
        """SIGTERM: each deregisters at once."""
        procs = [self.workers.pop(ident) for ident in list(ids)]
        await asyncio.gather(*(p.stop(within=30) for p in procs))

    async def close(self) -> None:
        procs = [*self.workers.values(), *(d.proc for d in self.daemons)]
        await asyncio.gather(*(p.kill() for p in procs))
        for d in self.daemons:
            assert "Traceback" not in d.proc.stderr, d.proc.stderr


@contextlib.asynccontextmanager
async def fleet(store_url: str, root: Path) -> AsyncIterator[Fleet]:
    started = Fleet(store_url, root)
    try:
        yield started
    finally:
        await started.close()


def pools_of(workers: Iterable[WorkerInfo], policy: PoolPolicy) -> dict[str, str | None]:
    """Worker id -> its one pool of ``policy`` (None for none; "a,b" for several)."""
    out: dict[str, str | None] = {}
    for info in workers:
        if policy.match.matches(info.record):
            held = held_pools(info.taints, policy)
            out[info.id] = ",".join(held) if held else None
    return out


def counted(held: Mapping[str, str | None]) -> dict[str, int]:
    found: dict[str, int] = {}
    for pool in held.values():
        if pool is not None:
            found[pool] = found.get(pool, 0) + 1
    return found


async def held_now(client: AsyncClient, policy: PoolPolicy) -> dict[str, str | None]:
    workers, _ = await client.list_workers(
        selector=policy.selector, fields=("id", "taints", "model")
    )
    return pools_of(workers, policy)


async def until_counts(
    client: AsyncClient,
    policy: PoolPolicy,
    wanted: Mapping[str, int],
    *,
    workers: int | None = None,
    within: float = 30.0,
) -> dict[str, str | None]:
    """The pools held once they count ``wanted`` (over ``workers`` workers when given),
    and the daemon's plan for the policy has nothing pending."""

    async def sample() -> tuple[dict[str, str | None], bool]:
        held = await held_now(client, policy)
        status = await client.pool_status(policy.name)
        return held, status.balanced

    def accept(found: tuple[dict[str, str | None], bool]) -> bool:
        held, balanced = found
        size_ok = workers is None or len(held) == workers
        return balanced and size_ok and counted(held) == dict(wanted) and None not in held.values()

    held, _ = await eventually(sample, accept, within=within, what=f"counts {dict(wanted)}")
    return held
