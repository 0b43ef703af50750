"""A pool move that keeps failing (issue 27): each worker backs off on its own, a refused
move waits for a change, and a store error costs a round, never the term (etcd killed and
restarted on the same data and port during a round that writes).

In process, on a memory store; the leader's writes fail through ``Writes.fail``. Counts of
attempts are bounded over a window (a slow machine only makes fewer), never timed."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from dynamod.discovery.updates import update_taints
from dynamod.errors import StoreUnavailableError, TaintLimitError
from dynamod.pools.move_failures import CAP, FIRST, delay_after
from dynamod.pools.policy import PoolPolicy
from dynamod.pools.policy_view import PolicyView
from dynamod.pools.pool_events import PoolEvents
from dynamod.pools.reconciler import TaintWriter
from dynamod.pools.stored import apply_policy
from dynamod.records import WorkerRecord
from dynamod.store import Store, open_store
from dynamod.taints import TaintUpdate
from dynamod.tasks import cancel_and_wait
from tests.pools.harness import Writes, add_workers, daemons, leader_of, until_counts
from tests.support.eventually import eventually
from tests.support.servers import EtcdServer

pytestmark = pytest.mark.timeout(60)

WINDOW = 4.0
"""Seconds attempts are counted over: with 1 s doubling, attempts at 0, 1 and 3 s."""


async def until(condition: Callable[[], bool], what: str) -> None:
    async def probe() -> bool:
        return condition()

    await eventually(probe, within=10, what=what)


def split() -> PoolPolicy:
    return PoolPolicy("split", "model=llama", {"pool=fast": 50, "pool=slow": 50})


@pytest.fixture
async def memory() -> Any:
    async with await open_store("memory://") as store:
        yield store


def test_the_delay_doubles_from_one_second_to_a_minute() -> None:
    assert [delay_after(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert (FIRST, CAP) == (1.0, 60.0)
    assert delay_after(10_000) == CAP


async def test_a_failing_move_backs_off_per_worker_and_status_says_why(memory: Store) -> None:
    await add_workers(memory, 2)
    attempts: Counter[str] = Counter()
    broken = {"on": True}

    def fail(record: WorkerRecord) -> None:
        attempts[record.instance_id] += 1
        if broken["on"]:
            raise StoreUnavailableError("the worker's store is away")

    policy = split()
    async with daemons(memory, writes=Writes(fail=fail)) as (started, _):
        await apply_policy(memory, policy)
        leader = await leader_of(started)
        reconciler = leader.reconciler
        await until(lambda: len(reconciler.failing("split")) == 2, "two failing workers")
        await asyncio.sleep(WINDOW)
        assert len(attempts) == 2
        assert max(attempts.values()) <= 4, f"attempts in {WINDOW} s: {dict(attempts)}"
        failing = reconciler.failing("split")
        assert {f.worker for f in failing} == set(attempts)
        for failure in failing:
            assert "StoreUnavailableError: the worker's store is away" in failure.error
            assert failure.attempts == attempts[failure.worker]
            assert not failure.refused
            assert failure.next_time > time.time() - 1
        counter = reconciler.metrics.failures.labels("split", "StoreUnavailableError")
        assert counter._value.get() == sum(attempts.values())
        broken["on"] = False  # the next attempt of each worker (within 8 s) succeeds
        await until_counts(leader.view, policy, {"pool=fast": 1, "pool=slow": 1}, within=20)
        assert reconciler.failing("split") == ()


async def test_a_refused_move_waits_for_a_change_of_the_worker(memory: Store) -> None:
    first, second = await add_workers(memory, 2)
    attempts: Counter[str] = Counter()
    refusing = {first.instance_id, second.instance_id}

    def fail(record: WorkerRecord) -> None:
        attempts[record.instance_id] += 1
        if record.instance_id in refusing:
            raise TaintLimitError("worker would hold 2 taints; the daemon allows 1")

    policy = split()
    async with daemons(memory, writes=Writes(fail=fail)) as ([daemon], _):
        await apply_policy(memory, policy)
        await until(lambda: len(daemon.reconciler.failing("split")) == 2, "two refused")
        await asyncio.sleep(WINDOW)
        assert dict(attempts) == {first.instance_id: 1, second.instance_id: 1}
        failing = {f.worker: f for f in daemon.reconciler.failing("split")}
        assert all(f.refused and f.next_time == 0 and f.attempts == 1 for f in failing.values())
        assert "allows 1" in failing[first.instance_id].error
        # The worker's record changes: its move is tried once more (and succeeds now).
        refusing.discard(first.instance_id)
        await update_taints(memory, first.key, TaintUpdate.add(["other"]))
        await until(lambda: attempts[first.instance_id] == 2, "a second attempt")
        await asyncio.sleep(1.0)
        assert attempts[second.instance_id] == 1
        assert [f.worker for f in daemon.reconciler.failing("split")] == [second.instance_id]
        # A reload of the daemon's settings: the other is tried again too.
        refusing.clear()
        daemon.reconciler.settings_changed()
        await until_counts(daemon.view, policy, {"pool=fast": 1, "pool=slow": 1})
        assert daemon.reconciler.failing("split") == ()


class KillAfterFirstMove(Writes):
    """Writes that SIGKILL etcd right after the first move that commits once armed: the
    round that writes goes on against a dead store (its history flush fails)."""

    def __init__(self, server: EtcdServer) -> None:
        super().__init__()
        self.server = server
        self.armed = False
        self.killed = asyncio.Event()

    def writer(self, store: Store, daemon: str) -> TaintWriter:
        inner = super().writer(store, daemon)

        async def write(record: WorkerRecord, update: TaintUpdate, **kwargs: Any) -> Any:
            outcome = await inner(record, update, **kwargs)
            if self.armed and not self.killed.is_set():
                self.server.stop(kill=True)
                self.killed.set()
            return outcome

        return write


@pytest.mark.timeout(120)
async def test_the_term_survives_an_etcd_restart_during_a_round_that_writes(
    private_etcd: EtcdServer,
) -> None:
    writes = KillAfterFirstMove(private_etcd)
    async with await open_store(private_etcd.url("pools")) as store:
        await add_workers(store, 6)
        policy = split()
        async with daemons(store, ttl=15.0, writes=writes) as ([daemon], _):
            await apply_policy(store, policy)
            await until_counts(daemon.view, policy, {"pool=fast": 3, "pool=slow": 3}, within=30)
            before = daemon.reconciler.leadership
            assert before is not None
            writes.armed = True
            await apply_policy(
                store, PoolPolicy("split", "model=llama", {"pool=fast": 1, "pool=slow": 5})
            )
            async with asyncio.timeout(30):
                await writes.killed.wait()
            await asyncio.sleep(1.0)  # the round's history flush meets the dead store
            await asyncio.to_thread(private_etcd.start)
            await until_counts(daemon.view, policy, {"pool=fast": 1, "pool=slow": 5}, within=60)
            after = daemon.reconciler.leadership
            assert after is before, "the term ended with the store restart"
            assert after.epoch == before.epoch
            assert not after.lost.is_set()
            assert {line["epoch"] for line in writes.moves()} == {before.epoch}


async def test_changes_while_the_pool_view_was_down_are_published_when_it_runs_again(
    memory: Store,
) -> None:
    """After a restart (the reconciler's, whose view runs again), the first snapshot is
    compared with what the view knew: a policy applied in the gap is APPLIED."""
    events = PoolEvents()
    view = PolicyView(memory, events)
    first = asyncio.create_task(view.run())
    await asyncio.wait_for(view.ready.wait(), 10)
    await cancel_and_wait(first)
    await apply_policy(memory, split())
    with events.subscribe() as seen:
        again = asyncio.create_task(view.run())
        try:
            async with asyncio.timeout(10):
                event = await anext(aiter(seen))
        finally:
            await cancel_and_wait(again)
    assert (event.info.kind, event.info.policy) == ("APPLIED", "split")
    assert "split" in view.policies
