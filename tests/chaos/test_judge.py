"""The chaos scenarios' oracle (``bench.load``'s taint log and verdicts) can say no: a
request served by a worker without its taint, or refused while a worker could take it,
is a failure; a change inside the uncertainty window is not."""

from __future__ import annotations

import asyncio
import dataclasses

from bench.load import Kind, Outcome, verdict
from bench.taintlog import TaintLog
from dynamod.discovery_events import DiscoveryEvent, ViewResync, WorkerModified, WorkerRemoved
from dynamod.records import WorkerRecord
from dynamod.taints import RoutingConstraints
from tests.support.factories import make_record

POOL_A = Kind("pool a", 1, RoutingConstraints(required_taints=frozenset({"pool=a"})))


def moved(record: WorkerRecord, *taints: str) -> WorkerRecord:
    config = dataclasses.replace(record.runtime_config, taints=tuple(sorted(taints)))
    return dataclasses.replace(record, runtime_config=config)


def outcome(kind: Kind, start: int, end: int, status: int, worker: str | None) -> Outcome:
    code = "no_eligible_worker" if status == 503 else ""
    return Outcome(kind, start, end, status, worker, code)


async def feed(log: TaintLog, *batches: list[DiscoveryEvent]) -> list[int]:
    """Each batch in one turn of the loop, as the view publishes; the batch times."""
    times = []
    for batch in batches:
        for event in batch:
            log.on_event(event)
        times.append(log.changes[-1].at_ns)
        await asyncio.sleep(0.002)  # the next batch is applied measurably later
    return times


async def test_a_request_served_by_a_worker_without_its_taint_is_a_violation() -> None:
    a, b = make_record(taints=["pool=a"]), make_record(taints=["pool=b"])
    log = TaintLog()
    [t0] = await feed(log, [ViewResync((a, b), 1)])
    assert verdict(outcome(POOL_A, t0 + 1, t0 + 2, 200, a.instance_id), log, 0) == "honoured"
    assert verdict(outcome(POOL_A, t0 + 1, t0 + 2, 200, b.instance_id), log, 0) == "violated"
    assert verdict(outcome(POOL_A, t0 + 1, t0 + 2, 200, "unknown"), log, 0) == "violated"


async def test_a_change_inside_the_window_leaves_either_state_possible() -> None:
    a, b = make_record(taints=["pool=a"]), make_record(taints=["pool=b"])
    log = TaintLog()
    moves_b = WorkerModified(moved(b, "pool=a"), (), (), 2)
    t0, t1 = await feed(log, [ViewResync((a, b), 1)], [moves_b])
    served_by_b = outcome(POOL_A, t1 - 1000, t1 + 1000, 200, b.instance_id)
    assert verdict(served_by_b, log, 0) == "honoured in window"
    before = outcome(POOL_A, t0 + 1, t1 - 1_000_000, 200, b.instance_id)
    assert verdict(before, log, 0) == "violated"
    assert verdict(before, log, 2_000_000) == "honoured in window"  # the slack widens it


async def test_a_refusal_is_justified_only_while_no_worker_could_take_the_request() -> None:
    a, b = make_record(taints=["pool=a"]), make_record(taints=["pool=b"])
    log = TaintLog()
    t0, t1, t2 = await feed(
        log,
        [ViewResync((a, b), 1)],
        [WorkerRemoved(a, 2)],
        [WorkerModified(moved(b, "pool=a"), (), (), 3)],
    )
    assert verdict(outcome(POOL_A, t0 + 1, t1 - 1, 503, None), log, 0) == "refused, unjustified"
    assert verdict(outcome(POOL_A, t1 + 1, t2 - 1, 503, None), log, 0) == "refused, justified"
    assert verdict(outcome(POOL_A, t2 + 1, t2 + 2, 503, None), log, 0) == "refused, unjustified"


async def test_a_resync_moving_workers_is_one_change_not_an_empty_moment() -> None:
    a, b = make_record(taints=["pool=a"]), make_record(taints=["pool=b"])
    log = TaintLog()
    swapped = (moved(a, "pool=b"), moved(b, "pool=a"))
    t0, t1 = await feed(log, [ViewResync((a, b), 1)], [ViewResync(swapped, 5)])
    refused = outcome(POOL_A, t0 + 1, t1 + 1, 503, None)
    assert verdict(refused, log, 0) == "refused, unjustified"
