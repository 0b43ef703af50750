"""In-process pool reconcilers on one store, for tests: each with its own worker view
(as each dynamod has), writing through ``discovery.updates.update_taints`` (what
``Control.update_taints`` calls) and logging each write as the audit would."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dynamod.discovery.registration import register
from dynamod.discovery.updates import update_taints
from dynamod.discovery.view import WorkerView
from dynamod.pools.leader import LeaderElection
from dynamod.pools.plan import held_pools
from dynamod.pools.policy import PoolPolicy
from dynamod.pools.reconciler import Check, Observed, PoolReconciler, TaintWriter
from dynamod.records import WorkerRecord
from dynamod.results import UpdateOutcome
from dynamod.store import Lease, Store
from dynamod.taints import TaintUpdate
from tests.support.factories import make_record

WITHIN = 10.0


@dataclass
class Daemon:
    """One in-process "dynamod": a worker view and a reconciler."""

    name: str
    view: WorkerView
    reconciler: PoolReconciler
    task: asyncio.Task[None]
    healthy: dict[str, bool] = field(default_factory=dict)


@dataclass
class Writes:
    """Every write the reconcilers made, as audit lines, in order."""

    lines: list[dict[str, Any]] = field(default_factory=list)
    fail: Callable[[WorkerRecord], None] | None = None
    """Raise for a worker's write before anything is written (tests of failures)."""

    def writer(self, store: Store, daemon: str) -> TaintWriter:
        async def write(
            record: WorkerRecord,
            update: TaintUpdate,
            *,
            expect_revision: int,
            check: Check,
            audit: Mapping[str, object],
        ) -> UpdateOutcome:
            if self.fail is not None:
                self.fail(record)
            outcome = await update_taints(
                store, record.key, update, expect_revision=expect_revision, check=check,
                base=record,
            )  # fmt: skip
            self.lines.append(
                {"daemon": daemon, "worker": record.instance_id, **audit,
                 "revision": outcome.revision, "after": list(outcome.after)}
            )  # fmt: skip
            return outcome

        return write

    def moves(self, policy: str | None = None) -> list[dict[str, Any]]:
        return [line for line in self.lines if policy in (None, line["pool_policy"])]


@contextlib.asynccontextmanager
async def daemons(
    store: Store, count: int = 1, *, ttl: float = 2.0, writes: Writes | None = None
) -> AsyncIterator[tuple[list[Daemon], Writes]]:
    """``count`` reconcilers on ``store``, each with its own view; stopped on exit."""
    log = writes or Writes()
    started: list[Daemon] = []
    try:
        for index in range(count):
            daemon = await start_daemon(store, f"d{index}", log, ttl=ttl)
            started.append(daemon)
        yield started, log
    finally:
        for daemon in started:
            await stop_daemon(daemon)


async def start_daemon(store: Store, name: str, writes: Writes, *, ttl: float = 2.0) -> Daemon:
    view = WorkerView(store)
    healthy: dict[str, bool] = {}
    reconciler = PoolReconciler(
        store, view, writes.writer(store, name), identity=name, ttl=ttl,
        observe=lambda key: Observed(healthy=healthy.get(key, True)),
    )  # fmt: skip

    async def both() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(view.run())
            await view.ready.wait()
            group.create_task(reconciler.run())

    task = asyncio.create_task(both(), name=f"daemon {name}")
    async with asyncio.timeout(WITHIN):
        await view.ready.wait()
    return Daemon(name, view, reconciler, task, healthy)


async def stop_daemon(daemon: Daemon) -> None:
    daemon.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await daemon.task


async def add_workers(
    store: Store, count: int, *, lease: Lease | None = None, **kwargs: Any
) -> list[WorkerRecord]:
    lease = lease or await store.grant(60)
    records = []
    for _ in range(count):
        record, _ = await register(store, make_record(**kwargs), lease)
        records.append(record)
    return records


def counts(view: WorkerView, policy: PoolPolicy) -> dict[str, int]:
    """Workers holding exactly one pool of ``policy``, by pool (and "" for none)."""
    found: dict[str, int] = {}
    for record in view.records():
        if policy.match.matches(record):
            held = held_pools(record.taints, policy)
            key = held[0] if len(held) == 1 else ",".join(held)
            found[key] = found.get(key, 0) + 1
    return found


async def until_counts(
    view: WorkerView, policy: PoolPolicy, wanted: Mapping[str, int], within: float = WITHIN
) -> None:
    """Wait until ``view`` shows ``wanted`` (pool -> workers) for ``policy``."""
    try:
        await view.wait_for(lambda v: counts(v, policy) == dict(wanted), within=within)
    except TimeoutError:
        raise AssertionError(f"{policy.name}: {counts(view, policy)} != {dict(wanted)}") from None


async def leader_of(daemons: list[Daemon], within: float = WITHIN) -> Daemon:
    """The daemon whose reconciler leads, once one does."""
    async with asyncio.timeout(within):
        while True:
            for daemon in daemons:
                if daemon.reconciler.leadership is not None:
                    return daemon
            await asyncio.sleep(0.01)


def election(daemon: Daemon) -> LeaderElection | None:
    return daemon.reconciler._election
