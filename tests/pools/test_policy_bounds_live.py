"""Issue 28's documents against a real daemon on etcd: an alias bomb and a 30,000-level
JSON document are refused with an audit line, the daemon's memory stays put, status keeps
answering meanwhile and the pool leader keeps its term."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import psutil
import pytest

from dynamod.errors import PoolPolicyError
from dynamod.pools.policy import PoolPolicy
from tests.pools.live import Daemon, fleet, policy_text, until_counts
from tests.pools.test_policy_bounds import _bomb_yaml

pytestmark = pytest.mark.timeout(300)


def refusals(d: Daemon) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in d.audit_log.read_text().splitlines()]
    return [line for line in lines if line.get("action") == "pool-apply" and "error" in line]


async def test_the_alias_bomb_and_a_deep_document_cost_a_live_daemon_nothing(
    etcd_url: str, tmp_path: Path
) -> None:
    async with fleet(etcd_url, tmp_path) as f:
        d = await f.start_daemon("d0")
        await f.start_workers(2)
        async with d.client() as client:
            await client.apply_policy(policy_text(1, 1))
            split = PoolPolicy.parse(policy_text(1, 1))
            await until_counts(client, split, {"pool=fast": 1, "pool=slow": 1}, workers=2)
            before = await client.pool_status("split")
            assert before.leading and before.epoch > 0
            rss = psutil.Process(d.proc.pid).memory_info().rss

            answered = 0
            done = asyncio.Event()

            async def statuses() -> None:
                nonlocal answered
                while not done.is_set():
                    await client.status()
                    answered += 1
                    await asyncio.sleep(0.01)

            poller = asyncio.create_task(statuses())
            started = time.monotonic()
            for _ in range(3):
                with pytest.raises(PoolPolicyError) as bomb:
                    await client.apply_policy(_bomb_yaml(8))
            took = time.monotonic() - started
            deep = '{"name": ' + "[" * 30_000 + "]" * 30_000 + "}"
            with pytest.raises(PoolPolicyError) as nested:
                await client.apply_policy(deep)
            done.set()
            await poller
            print(f"three alias bombs refused in {took:.3f} s; {answered} status answers meanwhile")

            grown = psutil.Process(d.proc.pid).memory_info().rss - rss
            assert grown <= 50 * 2**20, f"the daemon grew {grown / 2**20:.0f} MB"
            assert "expands to more than" in str(bomb.value) and len(str(bomb.value)) < 300
            assert str(nested.value).startswith("policy: the document nests deeper than 32")
            assert answered >= 1
            after = await client.pool_status("split")
            assert (after.leading, after.leader, after.epoch) == (
                True,
                before.leader,
                before.epoch,
            )
        lines = refusals(d)
        assert [line["outcome"] for line in lines] == ["PoolPolicyError"] * 4
        assert "nests deeper" in str(lines[-1]["error"])
    assert "RecursionError" not in d.proc.stderr
