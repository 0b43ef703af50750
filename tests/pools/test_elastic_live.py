"""Elastic pools with real processes: dynamod daemons on etcd, six ``dynamo-worker`` mockers
with a real time per token (``--speedup-ratio 1``) and two requests at once each.

The policy is premium 34 / batch 66 with ``min_per_pool: 1``: 2 and 4 workers while idle.
Ten clients in a loop send requests requiring ``pool=premium``: a static policy leaves
premium at 2 (each request waits behind the others); with ``elastic`` (``target_in_flight:
2``) the premium pool grows to hold them and gives its workers back once the load is gone
and ``scale_down_after`` has passed. Bounds are asserted only where the issue states one
(grows within 20 s, back within 35 s); everything else waits under deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from dynamod.client import AsyncClient
from dynamod.pools.policy import PoolPolicy
from tests.pools.live import Daemon, Fleet, counted, fleet, held_now, until_counts
from tests.support.eventually import eventually
from tests.support.scrape import scrape

pytestmark = [pytest.mark.solo, pytest.mark.timeout(300)]
"""Alone on the machine: the issue's time bounds and a latency ratio between two arms."""

MOCKER = ("--speedup-ratio", "1", "--max-num-seqs", "2")
"""Real time per token, two requests at once: a worker holds two requests in flight."""
TOKENS = 80
"""Tokens per request: about half a second on a mocker at speedup 1."""
CLIENTS = 10
PREMIUM = {"routing_constraints": {"required_taints": ["pool=premium"]}}
IDLE = {"pool=batch": 4, "pool=premium": 2}


def sla_text(scale_down_after: float | None = None) -> str:
    """The policy; elastic (``target_in_flight: 2``) when ``scale_down_after`` is given."""
    text = (
        "name: sla\nselector: model=llama\nmin_per_pool: 1\n"
        "pools:\n  pool=premium: 34\n  pool=batch: 66\n"
    )
    if scale_down_after is not None:
        text += f"elastic:\n  target_in_flight: 2\n  scale_down_after: {scale_down_after}\n"
    return text


POLICY = PoolPolicy.parse(sla_text(10))


@dataclass
class Load:
    """``CLIENTS`` premium clients in a loop against one daemon's front; each answer's
    latency with the time it ended."""

    front: str
    latencies: list[tuple[float, float]] = field(default_factory=list)

    def since(self, start: float) -> list[float]:
        return [latency for ended, latency in self.latencies if ended >= start]

    async def client(self, http: aiohttp.ClientSession) -> None:
        body = {"model": "llama", "prompt": "hello", "max_tokens": TOKENS, "nvext": PREMIUM}
        while True:
            started = time.monotonic()
            async with http.post(f"{self.front}/v1/completions", json=body) as response:
                await response.read()
                assert response.status == 200, await response.text()
            ended = time.monotonic()
            self.latencies.append((ended, ended - started))


@contextlib.asynccontextmanager
async def premium_load(daemon: Daemon) -> AsyncIterator[Load]:
    load = Load(daemon.front)
    async with aiohttp.ClientSession() as http, asyncio.TaskGroup() as group:
        clients = [group.create_task(load.client(http)) for _ in range(CLIENTS)]
        try:
            yield load
        finally:
            for task in clients:
                task.cancel()


async def premium_set(client: AsyncClient) -> frozenset[str]:
    held = await held_now(client, POLICY)
    return frozenset(worker for worker, pool in held.items() if pool == "pool=premium")


async def until_premium_grows(client: AsyncClient) -> None:
    """The issue's bound: the premium pool holds at least 4 workers within 20 s."""
    await eventually(
        lambda: premium_set(client), lambda s: len(s) >= 4, within=20, what="premium >= 4"
    )


async def test_an_elastic_pool_grows_with_demand_and_gives_workers_back(
    etcd_url: str, tmp_path: Path
) -> None:
    async with fleet(etcd_url, tmp_path) as pools:
        daemon = await pools.start_daemon("a")
        await pools.start_workers(6, *MOCKER)
        client = daemon.client()
        await client.apply_policy(sla_text())
        await until_counts(client, POLICY, IDLE, workers=6)

        # The static policy: premium stays at 2 under the surge.
        async with premium_load(daemon) as static:

            async def answered() -> int:
                return len(static.latencies)

            await eventually(answered, lambda n: n >= 4 * CLIENTS, within=60, what="answers")
            begun = time.monotonic()
            for _ in range(10):
                assert len(await premium_set(client)) == 2
                await asyncio.sleep(0.5)
            static_p50 = statistics.median(static.since(begun))

        # Elastic: the same surge grows premium to at least 4 within 20 s, batch keeps one.
        await client.apply_policy(sla_text(10))
        async with premium_load(daemon) as elastic:
            await until_premium_grows(client)
            await asyncio.sleep(3)  # the moved workers finish what they had in flight
            steady = time.monotonic()
            sets = []
            while time.monotonic() - steady < 15:
                held = counted(await held_now(client, POLICY))
                assert held.get("pool=batch", 0) >= 1, held
                sets.append(await premium_set(client))
                await asyncio.sleep(0.5)
            changes = sum(1 for a, b in itertools.pairwise(sets) if a != b)
            assert changes <= 1, f"the premium set changed {changes} times under steady load"
            assert len(sets[-1]) >= 4
            elastic_p50 = statistics.median(elastic.since(steady))
            status = await client.pool_status("sla")
            by_pool = {c.pool: c for c in status.pools}
            premium = by_pool["pool=premium"]
            assert premium.demand is not None and premium.demand >= 4, status.pools
            assert premium.want is not None and premium.want >= 4, status.pools
            assert any(m.why == "demand" for m in status.recent), status.recent
            async with aiohttp.ClientSession() as http:
                samples = await scrape(http, f"{daemon.front}/metrics")
            assert samples['dynamod_pool_demand{policy="sla",pool="pool=premium"}'] >= 0
            assert samples['dynamod_pool_wanted_workers{policy="sla",pool="pool=premium"}'] >= 4
        assert elastic_p50 <= 0.7 * static_p50, (elastic_p50, static_p50)

        # The load is gone: premium is back to 2 within 35 s (scale_down_after 10).
        await until_counts(client, POLICY, IDLE, workers=6, within=35)


async def leader_and_follower(pools: Fleet, scale_down_after: float) -> tuple[Daemon, Daemon]:
    """Two daemons, six mockers, the elastic policy applied and idle: (leader, follower)."""
    first = await pools.start_daemon("a")
    second = await pools.start_daemon("b")
    await pools.start_workers(6, *MOCKER)
    client = first.client()
    await client.apply_policy(sla_text(scale_down_after))
    await until_counts(client, POLICY, IDLE, workers=6)
    leads = (await client.pool_status("sla")).leader == first.name
    return (first, second) if leads else (second, first)


async def test_a_follower_s_demand_grows_the_leader_s_pool(etcd_url: str, tmp_path: Path) -> None:
    """The premium clients reach the follower only; the leader still grows the pool."""
    async with fleet(etcd_url, tmp_path) as pools:
        leader, follower = await leader_and_follower(pools, 10)
        client = leader.client()
        async with premium_load(follower):
            await until_premium_grows(client)
        assert any(m["move"]["why"] == "demand" for m in leader.moves())
        assert not follower.moves()


@pytest.mark.slow
async def test_a_new_leader_carries_the_elastic_window_on(etcd_url: str, tmp_path: Path) -> None:
    """Surge, then the leader is killed as the load stops: the new leader keeps the grown
    pool for ``scale_down_after`` (the window in the history), not shrinking it at once as a
    leader without history would, then gives the workers back."""
    async with fleet(etcd_url, tmp_path) as pools:
        leader, survivor = await leader_and_follower(pools, 30)
        watcher = survivor.client()
        async with premium_load(survivor):
            await until_premium_grows(watcher)
            await asyncio.sleep(6)  # past WINDOW_EVERY: the window with the surge is stored
        pools.daemons.remove(leader)
        await leader.proc.kill()

        async def survivor_leads() -> bool:
            return (await watcher.pool_status("sla")).leading

        await eventually(survivor_leads, within=30, what="the survivor leads")
        for _ in range(10):  # the load is gone, but the window holds the want for 30 s
            assert len(await premium_set(watcher)) >= 4
            await asyncio.sleep(0.5)
        await until_counts(watcher, POLICY, IDLE, workers=6, within=60)
