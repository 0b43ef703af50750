"""The discovery store is SIGKILLed and restarted while requests flow and workers change
pools: routing goes on from the daemon's last view, nothing is routed against its
constraints, no acknowledged taint update is lost, and the daemon's view catches up."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from bench.load import Flipper, daemon_caught_up, judge
from tests.chaos.harness import (
    SETTLE,
    SLACK_MS,
    Cluster,
    Figures,
    cluster,
    flip_acknowledged,
    judged,
    loaded,
    sent_between,
    unanswered,
)
from tests.support.servers import EtcdServer, NatsServer, ServerProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BEFORE = 3.0  # seconds of load on a healthy store
OUTAGE = 3.0  # seconds the server stays down: longer than the workers' lease TTL (2 s)
AFTER = 4.0  # seconds of load after the restart


async def recovery(c: Cluster, flipper: Flipper) -> int:
    """When both views have passed a write made after the restart (so also whatever the
    store did at restart, expiries included), every worker is back in this view, and the
    daemon has caught up with it."""
    await flip_acknowledged(c, flipper)
    await c.view.wait_for(lambda v: len(v) == len(c.workers), within=SETTLE)
    await daemon_caught_up(c.client, c.log.changes[-1].revision)
    return time.monotonic_ns()


async def outage_under_load(
    server: ServerProcess, url: str, tmp_path: Path
) -> dict[str, float | int]:
    async with cluster(url, tmp_path) as c:
        async with loaded(c) as (load, flipper):
            await asyncio.sleep(BEFORE)
            await asyncio.to_thread(server.stop, kill=True)
            await asyncio.sleep(OUTAGE)
            await asyncio.to_thread(server.start)
            back = time.monotonic_ns()
            assert flipper is not None
            recovered = await recovery(c, flipper)
            await asyncio.sleep(AFTER)
        assert flipper is not None
        # A write made after the restart must reach the daemon's view: its watch recovered.
        await flip_acknowledged(c, flipper)
        assert await c.settled(flipper.flips) == []
        # The daemon routes from its last view while the store is away, and workers serve
        # without it: every request is answered, or refused while no worker could take it.
        strict = [o for o in load.outcomes if not back <= o.sent_ns < recovered]
        judgement = judged(strict, c.log)
        assert unanswered(strict, c.log) == []
        # While the views reconnect, one may run a second behind the other, so the daemon
        # may act on a state this test's view learns of later (expired records gone, a
        # worker back in another pool). Then the window is the whole recovery: a refusal
        # is fine, a worker that never held the taints around then is not.
        recovery_ms = (recovered - back) / 1e6 + SLACK_MS
        meanwhile = judge(sent_between(load.outcomes, back, recovered), c.log, slack_ms=recovery_ms)
        assert meanwhile.verdicts["violated"] == 0, meanwhile.failures
        assert sent_between(load.outcomes, recovered, time.monotonic_ns()), "no load after"
        for proc in (*c.workers, c.dynamod):
            proc.assert_clean_stderr()
        removals = sum(1 for change in c.log.changes if change.taints is None)
        return {
            "recovery (s)": round((recovered - back) / 1e9, 3),
            "requests": len(load.outcomes),
            "flips acknowledged": flipper.flips.ok,
            "flips refused": sum(flipper.flips.failed.values()),
            "records expired and re-registered": removals,
            **judgement.verdicts,
        }


async def test_etcd_killed_and_restarted_during_load(
    private_etcd: EtcdServer, tmp_path: Path, figures: Figures
) -> None:
    counts = await outage_under_load(private_etcd, private_etcd.url("chaos"), tmp_path)
    for name, value in counts.items():
        figures.record(name, value)


async def test_nats_server_killed_and_restarted_during_load(
    nats_server: NatsServer, tmp_path: Path, figures: Figures
) -> None:
    """The outage outlasts the workers' TTL: on NATS their records expire when the server
    comes back (per-key TTL), and each worker registers again with its latest taints."""
    counts = await outage_under_load(nats_server, nats_server.url("chaos"), tmp_path)
    for name, value in counts.items():
        figures.record(name, value)
