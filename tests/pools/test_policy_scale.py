"""A thousand policies in process (issue 28): every worker is placed and a joining one
soon after (0.01-0.3 s here; on main the first round alone takes minutes), since a round
looks at each policy's own workers only (``owners``) and compares each policy only with
those it could overlap (``stored.in_force``). Times are printed, not asserted."""

from __future__ import annotations

import time
from typing import Any

import pytest

from dynamod.pools.plan import held_pools
from dynamod.pools.policy import PoolPolicy
from dynamod.pools.stored import encode
from dynamod.store import Store, open_store
from tests.pools.harness import add_workers, daemons

pytestmark = pytest.mark.timeout(300)

POLICIES = 1000


def policy(i: int) -> PoolPolicy:
    return PoolPolicy(f"p{i}", f"model=m{i}", {"pool=fast": 1, "pool=slow": 1})


@pytest.fixture
async def memory() -> Any:
    async with await open_store("memory://") as store:
        yield store


async def test_a_joining_worker_is_placed_within_a_second_at_a_thousand_policies(
    memory: Store,
) -> None:
    for i in range(POLICIES):
        await memory.put(policy(i).key, encode(policy(i)))
    lease = await memory.grant(60)
    for i in range(POLICIES):
        await add_workers(memory, 1, lease=lease, model=f"m{i}")
    async with daemons(memory) as ([daemon], _):
        view = daemon.view

        def placed(model: str) -> int:
            mine = [r for r in view.records() if r.model == model]
            return sum(len(held_pools(r.taints, policy(0))) == 1 for r in mine)

        sample = range(0, POLICIES, 97)
        await view.wait_for(lambda v: all(placed(f"m{i}") for i in sample), within=120.0)
        took = []
        for n in (500, 501, 502):
            started = time.monotonic()
            await add_workers(memory, 1, lease=lease, model=f"m{n}")
            model = f"m{n}"
            await view.wait_for(lambda v: placed(model) == 2, within=10.0)  # noqa: B023
            took.append(time.monotonic() - started)
        print(f"joining workers placed after {', '.join(f'{t:.3f}' for t in took)} s")
