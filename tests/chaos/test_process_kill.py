"""Processes SIGKILLed under load: a worker (its requests fail over, it leaves the view
within its lease TTL, nothing is routed to it afterwards) and dynamod itself (clients
reconnect to the restarted daemon, which rebuilds its state from the store, including
taint changes made while it was down)."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from bench.load import daemon_caught_up
from dynamod.client import AsyncClient
from dynamod.errors import UnreachableError
from dynamod.results import WorkerInfo
from tests.chaos.harness import (
    RETRY,
    SETTLE,
    Figures,
    cluster,
    flip_acknowledged,
    judged,
    loaded,
    sent_between,
    unanswered,
)

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(180)]

LEASE_TTL = 2.0  # tests.support.processes.worker_argv
EXPIRY_MARGIN = 1.5  # etcd revokes expired leases on a ~0.5 s tick; then the watch hop
RETRIES = "dynamod_front_retries_total"
BEFORE = 2.0
AFTER = 3.0


async def test_worker_sigkilled_during_load_leaves_the_view_and_gets_no_more_requests(
    etcd_url: str, tmp_path: Path, figures: Figures
) -> None:
    async with cluster(etcd_url, tmp_path) as c:
        victim = c.workers[0]
        key = victim.field("key")
        async with loaded(c, flip_rate=None) as (load, _):
            await asyncio.sleep(BEFORE)
            killed = time.monotonic_ns()
            victim.send(signal.SIGKILL)
            # The contract: a crashed worker's record is gone within one lease TTL.
            await c.view.wait_for(lambda v: v.get(key) is None, within=LEASE_TTL + EXPIRY_MARGIN)
            removal = c.log.changes[-1]
            assert removal.key == key and removal.taints is None
            await daemon_caught_up(c.client, removal.revision)
            gone = time.monotonic_ns()
            retries = await c.metric(RETRIES)
            await asyncio.sleep(AFTER)
        assert await c.metric(RETRIES) == retries, "a request was routed to the dead worker"
        assert key not in {w.record.key for w in (await c.client.list_workers())[0]}
        assert await c.settled() == []
        judgement = judged(load.outcomes, c.log)
        assert unanswered(sent_between(load.outcomes, 0, killed), c.log) == []
        assert unanswered(sent_between(load.outcomes, gone, time.monotonic_ns()), c.log) == []
        for proc in (*c.workers[1:], c.dynamod):
            proc.assert_clean_stderr()
    in_ttl = sent_between(load.outcomes, killed, gone)
    figures.record("removed after (s)", round((removal.at_ns - killed) / 1e9, 3))
    figures.record("lease TTL (s)", LEASE_TTL)
    figures.record("requests while the record lived", len(in_ttl))
    figures.record("failed while the record lived", len(unanswered(in_ttl, c.log)))
    figures.record("front retries", retries)
    figures.record("requests", len(load.outcomes))
    for name, count in judgement.verdicts.items():
        figures.record(name, count)


async def reconnected(client: AsyncClient) -> list[WorkerInfo]:
    """``ListWorkers`` through a client made before the daemon died. gRPC reconnects on the
    next call; one made while the new daemon is still binding fails, so retry briefly."""
    for _ in range(int(SETTLE / RETRY)):
        try:
            return (await client.list_workers())[0]
        except UnreachableError:
            await asyncio.sleep(RETRY)
    raise AssertionError(f"the client did not reconnect within {SETTLE} s")


async def test_dynamod_sigkilled_and_restarted_rebuilds_its_view_from_the_store(
    etcd_url: str, tmp_path: Path, figures: Figures
) -> None:
    async with cluster(etcd_url, tmp_path) as c:
        async with loaded(c) as (load, flipper):
            await asyncio.sleep(BEFORE)
            c.dynamod.send(signal.SIGKILL)
            await c.dynamod.wait()
            killed = time.monotonic_ns()
            await asyncio.sleep(AFTER)  # workers keep changing pools meanwhile
            restarting = time.monotonic_ns()
            await c.restart_dynamod()
            ready = time.monotonic_ns()
            workers = await reconnected(c.client)
            await asyncio.sleep(AFTER)
        assert flipper is not None
        assert any(killed < t < restarting for t in flipper.flips.acked_ns)
        assert {w.record.key for w in workers} == {p.field("key") for p in c.workers}
        await flip_acknowledged(c, flipper)
        assert await c.settled(flipper.flips) == []
        judgement = judged(load.outcomes, c.log)
        # While no daemon runs, nothing answers. A request sent while the new one starts may
        # be answered once it serves: its listeners are bound before its first snapshot.
        down = sent_between(load.outcomes, killed, restarting)
        assert down and all(o.status is None for o in down), "answers from a dead daemon?"
        assert unanswered(sent_between(load.outcomes, ready, time.monotonic_ns()), c.log) == []
        c.dynamod.assert_clean_stderr()
    figures.record("restart to ready (s)", round((ready - restarting) / 1e9, 3))
    figures.record("requests while down (no answer)", len(down))
    figures.record("moves while down", sum(killed < t < restarting for t in flipper.flips.acked_ns))
    figures.record("requests", len(load.outcomes))
    for name, count in judgement.verdicts.items():
        figures.record(name, count)
