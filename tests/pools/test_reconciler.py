"""The pool reconciler in process, on a memory store: counts, minimal moves, drift, pause,
routability, dropped pools, removal, failures, and one writer among several reconcilers.

Real dynamod processes and mocker workers on etcd, NATS and the file store are in
``test_pools_live.py``; these scenarios pin down each rule quickly."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from dynamod.discovery.updates import update_taints
from dynamod.errors import StoreUnavailableError
from dynamod.pools.policy import PoolPolicy
from dynamod.pools.pool_events import PoolEvent
from dynamod.pools.stored import apply_policy, remove_policy, set_paused
from dynamod.records import WorkerRecord
from dynamod.store import Store, open_store
from dynamod.taints import CORDONED, TaintUpdate
from tests.pools.harness import (
    Writes,
    add_workers,
    counts,
    daemons,
    leader_of,
    stop_daemon,
    until_counts,
)
from tests.support.eventually import eventually

pytestmark = pytest.mark.timeout(60)


def split(fast: float, slow: float, **extra: Any) -> PoolPolicy:
    return PoolPolicy("split", "model=llama", {"pool=fast": fast, "pool=slow": slow}, **extra)


@pytest.fixture
async def memory() -> Any:
    async with await open_store("memory://") as store:
        yield store


async def events_of(daemon: Any, kinds: set[str], count: int) -> list[PoolEvent]:
    """The first ``count`` pool events of ``kinds`` from now on."""
    found: list[PoolEvent] = []
    with daemon.reconciler.events.subscribe() as events:
        async with asyncio.timeout(10):
            async for event in events:
                if event.info.kind in kinds:
                    found.append(event)
                    if len(found) == count:
                        return found
    raise AssertionError("the event stream ended")


async def test_ten_workers_split_forty_sixty_then_a_weight_change_moves_exactly_one(
    memory: Store,
) -> None:
    await add_workers(memory, 10)
    async with daemons(memory) as ([daemon], writes):
        await apply_policy(memory, split(40, 60))
        await until_counts(daemon.view, split(40, 60), {"pool=fast": 4, "pool=slow": 6})
        assert len(writes.lines) == 10
        assert {line["move"]["why"] for line in writes.lines} == {"joined"}
        assert {line["epoch"] for line in writes.lines} == {daemon.reconciler.leadership.epoch}  # type: ignore[union-attr]

        await apply_policy(memory, split(50, 50))
        await until_counts(daemon.view, split(50, 50), {"pool=fast": 5, "pool=slow": 5})
        changed = writes.lines[10:]
        assert [line["move"] for line in changed] == [
            {"from": "pool=slow", "to": "pool=fast", "why": "rebalance"}
        ]


async def test_departures_and_joins_follow_largest_remainder_with_minimal_moves(
    memory: Store,
) -> None:
    lease = await memory.grant(60)
    leaving = await add_workers(memory, 2, lease=lease)
    await add_workers(memory, 8)
    policy = split(50, 50)
    async with daemons(memory) as ([daemon], writes):
        await apply_policy(memory, policy)
        await until_counts(daemon.view, policy, {"pool=fast": 5, "pool=slow": 5})
        held = {w.instance_id: counts_of(daemon, w) for w in leaving}
        await memory.revoke(lease)
        # 8 workers: 4 / 4. Two leaving from one pool cost one move; from both, none.
        await until_counts(daemon.view, policy, {"pool=fast": 4, "pool=slow": 4})
        both_from_one = len(set(held.values())) == 1
        assert len(writes.lines) == 10 + (1 if both_from_one else 0)

        before = len(writes.lines)
        await add_workers(memory, 3)
        await until_counts(daemon.view, policy, {"pool=fast": 6, "pool=slow": 5})
        assert [line["move"]["why"] for line in writes.lines[before:]] == ["joined"] * 3


def counts_of(daemon: Any, record: WorkerRecord) -> str:
    found: WorkerRecord = daemon.view.get(record.key)
    return next(t for t in found.taints if t.startswith("pool="))


async def test_drift_is_put_back_and_reported_on_every_daemon(memory: Store) -> None:
    [worker, *_] = await add_workers(memory, 4)
    policy = split(50, 50)
    async with daemons(memory, 2) as (both, writes):
        await apply_policy(memory, policy)
        await until_counts(both[0].view, policy, {"pool=fast": 2, "pool=slow": 2})
        leader = await leader_of(both)
        follower = next(d for d in both if d is not leader)
        assigned = counts_of(leader, worker)
        drift_seen = asyncio.ensure_future(events_of(follower, {"DRIFT"}, 1))
        await asyncio.sleep(0)
        foreign = await update_taints(memory, worker.key, TaintUpdate.remove([assigned]))
        [drift] = await drift_seen
        assert drift.info.worker == worker.instance_id
        assert drift.info.held == () and drift.info.to_pool == assigned
        assert drift.info.why == "put back" and drift.revision == foreign.revision
        await until_counts(both[0].view, policy, {"pool=fast": 2, "pool=slow": 2})
        assert counts_of(leader, worker) == assigned
        assert writes.lines[-1]["move"] == {"from": None, "to": assigned, "why": "drift"}
        assert {line["daemon"] for line in writes.lines} == {leader.name}
        metric = leader.reconciler.metrics.drift.labels("split")._value.get()
        assert metric == 1


async def test_a_paused_policy_reports_drift_and_leaves_it_until_resumed(memory: Store) -> None:
    [worker, *_] = await add_workers(memory, 2)
    policy = split(50, 50)
    async with daemons(memory) as ([daemon], writes):
        await apply_policy(memory, policy)
        await until_counts(daemon.view, policy, {"pool=fast": 1, "pool=slow": 1})
        assigned = counts_of(daemon, worker)
        other = "pool=slow" if assigned == "pool=fast" else "pool=fast"
        await set_paused(memory, "split", True)
        drift_seen = asyncio.ensure_future(events_of(daemon, {"DRIFT"}, 1))
        await asyncio.sleep(0)
        await update_taints(memory, worker.key, TaintUpdate.replace([other]))
        [drift] = await drift_seen
        assert drift.info.why == "left as it is: the policy is paused"
        written = len(writes.lines)
        await until_counts(daemon.view, policy, {other: 2})
        resumed = asyncio.ensure_future(events_of(daemon, {"MOVED"}, 1))
        await asyncio.sleep(0)
        await set_paused(memory, "split", False)
        [moved] = await resumed
        assert moved.info.why == "drift" and moved.info.to_pool == assigned
        assert len(writes.lines) == written + 1


async def test_cordoned_and_unhealthy_workers_are_not_counted_and_keep_their_pool(
    memory: Store,
) -> None:
    workers = await add_workers(memory, 4)
    policy = split(50, 50)
    async with daemons(memory) as ([daemon], writes):
        await apply_policy(memory, policy)
        await until_counts(daemon.view, policy, {"pool=fast": 2, "pool=slow": 2})
        fast = [w for w in workers if counts_of(daemon, w) == "pool=fast"]
        await update_taints(memory, fast[0].key, TaintUpdate.add([CORDONED]))
        daemon.healthy[fast[1].key] = False
        daemon.reconciler.engine_reported(fast[1].key, False)
        # Two routable workers left, both slow: one moves to fast.
        await daemon.view.wait_for(lambda v: sum("pool=fast" in r.taints for r in v.records()) == 3)
        assert counts_of(daemon, fast[0]) == "pool=fast"  # kept, not counted
        assert [line["move"]["why"] for line in writes.lines[4:]] == ["rebalance"]


async def test_a_dropped_pool_is_stripped_and_removal_leaves_taints(memory: Store) -> None:
    await add_workers(memory, 6)
    three = PoolPolicy("split", "model=llama", {"pool=a": 1, "pool=b": 1, "pool=c": 1})
    two = PoolPolicy("split", "model=llama", {"pool=a": 1, "pool=b": 1})
    async with daemons(memory) as ([daemon], writes):
        await apply_policy(memory, three)
        await until_counts(daemon.view, three, {"pool=a": 2, "pool=b": 2, "pool=c": 2})
        stored, kind = await apply_policy(memory, two)
        assert kind == "changed" and stored.retired == {"pool=c"}
        await until_counts(daemon.view, three, {"pool=a": 3, "pool=b": 3})
        assert [line["move"]["why"] for line in writes.lines[6:]] == ["joined", "joined"]
        before = len(writes.lines)
        removed = asyncio.ensure_future(events_of(daemon, {"REMOVED"}, 1))
        await asyncio.sleep(0)
        await remove_policy(memory, "split")
        await removed
        await update_taints(memory, daemon.view.records()[0].key, TaintUpdate.clear())
        await asyncio.sleep(0.2)  # the reconciler would have answered by now
        assert len(writes.lines) == before
        assert counts(daemon.view, two).get("", 0) == 1


async def test_a_failing_write_is_retried_and_a_failing_reconciler_starts_again(
    memory: Store,
) -> None:
    await add_workers(memory, 2)
    failures = {"unavailable": 2, "bug": 1}

    def fail(record: WorkerRecord) -> None:
        if failures["bug"]:
            failures["bug"] -= 1
            raise RuntimeError("a bug in the writer")
        if failures["unavailable"]:
            failures["unavailable"] -= 1
            raise StoreUnavailableError("the store is away")

    policy = split(50, 50)
    async with daemons(memory, writes=Writes(fail=fail)) as ([daemon], _):
        await apply_policy(memory, policy)
        await until_counts(daemon.view, policy, {"pool=fast": 1, "pool=slow": 1})
        assert not daemon.task.done()
        assert failures == {"unavailable": 0, "bug": 0}
        errors = daemon.reconciler.metrics.failures.labels("split", "StoreUnavailableError")
        assert errors._value.get() == 2


async def test_one_writer_among_three_and_the_next_leader_carries_on(memory: Store) -> None:
    await add_workers(memory, 6)
    policy = split(1, 2)
    async with daemons(memory, 3, ttl=1.0) as (three, writes):
        await apply_policy(memory, policy)
        await until_counts(three[0].view, policy, {"pool=fast": 2, "pool=slow": 4})
        first = await leader_of(three)
        assert {line["daemon"] for line in writes.lines} == {first.name}
        for follower in (d for d in three if d is not first):
            assert follower.reconciler.leadership is None
            assert follower.reconciler.plan_of(follower.reconciler.view.policies["split"]).balanced
        await stop_daemon(first)
        rest = [d for d in three if d is not first]
        second = await leader_of(rest)
        await add_workers(memory, 3)
        await until_counts(second.view, policy, {"pool=fast": 3, "pool=slow": 6})
        epochs = {line["daemon"]: line["epoch"] for line in writes.lines}
        assert epochs[second.name] > epochs[first.name]
        assert {line["daemon"] for line in writes.lines[6:]} == {second.name}


async def test_a_large_round_counts_every_move_its_concurrent_writers_made(
    etcd_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The writers of one round run at once on a store that answers over the network; the
    round's count (its log line, and whether it plans again) must hold each one's moves."""
    caplog.set_level(logging.INFO, "dynamod.pools.reconcile_step")
    async with await open_store(etcd_url) as etcd:
        await add_workers(etcd, 40)
        async with daemons(etcd) as ([daemon], writes):
            await apply_policy(etcd, split(40, 60))
            await until_counts(daemon.view, split(40, 60), {"pool=fast": 16, "pool=slow": 24})
            assert len(writes.lines) == 40

            async def moved() -> list[str]:  # logged once the writes return: after the view
                return [r.getMessage() for r in caplog.records if "workers moved" in r.getMessage()]

            lines = await eventually(moved, what="the round's line")
            assert "40 of 40 workers moved" in lines[0], lines
