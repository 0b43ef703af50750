"""A policy's plan is bounded in cost at apply (issue 28): a spread over more pools times
domain values than ``MAX_SPREAD_CELLS`` among the workers selected is refused through the
API, audited, and nothing is stored; one domain fewer is applied and planned."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dynamod.errors import PoolPolicyError
from dynamod.pools.policy import MAX_SPREAD_CELLS
from dynamod.store import Store, open_store
from tests.daemon.helpers import add_worker, client_for, running_daemon, settings_for

pytestmark = pytest.mark.timeout(120)

ZONES = MAX_SPREAD_CELLS // 2 + 1
WIDE = "name: wide\nselector: model=llama\nspread_by: zone\npools:\n  pool=a: 1\n  pool=b: 1\n"


@pytest.fixture
async def memory() -> Any:
    async with await open_store("memory://") as store:
        yield store


async def test_a_spread_over_too_many_cells_is_refused_at_apply(
    memory: Store, tmp_path: Path
) -> None:
    for zone in range(ZONES):
        await add_worker(memory, model="llama", topology={"zone": f"z{zone}"})
    settings = settings_for(memory, tmp_path)
    async with running_daemon(memory, settings), client_for(settings) as client:
        with pytest.raises(PoolPolicyError) as refused:
            await client.apply_policy(WIDE)
        assert str(refused.value).startswith(
            f"spread_by: 2 pools over {ZONES} values of dynamo.topology/zone among the "
            f"workers selected is {2 * ZONES} cells; the limit is {MAX_SPREAD_CELLS}"
        )
        assert await client.list_policies() == []
        narrower = WIDE.replace("model=llama", "model=llama,!dynamo.topology/zone=z0")
        applied = await client.apply_policy(narrower)
        assert applied.outcome == "created" and len(applied.moves) == ZONES - 1
    lines = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    refusal = [line for line in lines if line.get("error")]
    assert [(r["pool_policy"], r["outcome"]) for r in refusal] == [("wide", "PoolPolicyError")]
