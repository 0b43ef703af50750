"""Write-ahead intents settled by the next leader, in process on a real etcd: a dead
leader's batch left in the history as its intent, one move made in the store, one not.
The real kill of a leader inside that window is ``test_intents_live.py``."""

from __future__ import annotations

import logging

import pytest

from dynamod.discovery.updates import update_taints
from dynamod.pools.history import HistoryWriter, PoolHistory, decode, history_key
from dynamod.pools.intents import Intended, Intent
from dynamod.pools.policy import PoolPolicy
from dynamod.pools.stored import apply_policy
from dynamod.store import Store, open_store
from dynamod.taints import TaintUpdate
from tests.pools.harness import add_workers, daemons, leader_of, until_counts
from tests.support.eventually import eventually

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def etcd(etcd_url: str) -> Store:  # type: ignore[misc]
    async with await open_store(etcd_url) as store:
        yield store


async def revision_of(store: Store, key: str) -> int:
    entry = await store.get(key)
    assert entry is not None
    return entry.revision


async def test_a_dead_leaders_intent_is_settled_made_moves_logged_the_others_dropped(
    etcd: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dynamod.pools")
    policy = PoolPolicy("split", "model=llama", {"pool=fast": 1, "pool=slow": 1})
    made, lost = await add_workers(etcd, 2)
    made_at, lost_at = [await revision_of(etcd, r.key) for r in (made, lost)]
    dead = HistoryWriter("split", "dead", 7)
    await dead.load(etcd)
    intent = Intent(
        1_000_000.0, 7, "dead",
        (Intended(made.instance_id, made.key, "", "pool=fast", "joined", made_at),
         Intended(lost.instance_id, lost.key, "", "pool=slow", "joined", lost_at)),
    )  # fmt: skip
    assert await dead.intend(etcd, lambda: 7, intent)
    # the batch's first write landed, the dead leader logged nothing
    moved = await update_taints(
        etcd, made.key, TaintUpdate.replace(["pool=fast"]), expect_revision=made_at
    )
    await apply_policy(etcd, policy)

    async with daemons(etcd) as (started, _):
        leader = await leader_of(started, within=30)
        await until_counts(leader.view, policy, {"pool=fast": 1, "pool=slow": 1}, within=30)

        async def history() -> PoolHistory | None:
            entry = await etcd.get(history_key("split"))
            return None if entry is None else decode(entry)

        found = await eventually(
            history,
            lambda h: h is not None and not h.intents and len(h.moves) == 2,
            within=30,
            what="settled",
        )
    assert found is not None
    moves = [m for _, m in found.moves]
    [settled] = [m for m in moves if m.reconciled]
    assert settled.worker == made.instance_id and settled.to_pool == "pool=fast", moves
    assert (settled.leader, settled.epoch, settled.time) == ("dead", 7, 1_000_000.0), settled
    assert settled.revision == moved.revision and settled.reconciled == leader.name, settled
    # the other was not made by the dead leader: dropped, said so, and made by this one
    assert [m.leader for m in moves if m.worker == lost.instance_id] == [leader.name], moves
    dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert any(lost.instance_id in line for line in dropped), dropped
