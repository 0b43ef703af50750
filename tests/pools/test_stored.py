"""Pool policies in every store: stored at ``v1/pools/<name>`` and revisioned by the store;
a refused or overlapping policy stores nothing; the same document twice writes nothing;
pause, resume and removal are compare-and-swaps; a dropped pool is retired. And the one
write of a pool move: ``update_taints`` at a known revision, one round trip, still a
compare-and-swap."""

from __future__ import annotations

import pytest

from dynamod.discovery.registration import register
from dynamod.discovery.updates import update_taints
from dynamod.errors import PolicyNotFoundError, PoolPolicyError, RevisionMismatchError
from dynamod.pools.history import history_key
from dynamod.pools.policy import PoolPolicy
from dynamod.pools.stored import (
    MAX_POLICIES,
    apply_policy,
    encode,
    get_policy,
    in_force,
    list_policies,
    remove_policy,
    set_paused,
)
from dynamod.store import Store, open_store
from dynamod.taints import TaintUpdate
from tests.support.factories import make_record

pytestmark = pytest.mark.timeout(60)

SPLIT = "name: split\nselector: model=llama\npools:\n  pool=fast: 40\n  pool=slow: 60\n"


async def test_apply_stores_under_v1_pools_and_twice_changes_nothing(store: Store) -> None:
    policy = PoolPolicy.parse(SPLIT)
    stored, kind = await apply_policy(store, policy)
    assert kind == "created" and stored.revision > 0
    entry = await store.get("v1/pools/split")
    assert entry is not None and entry.revision == stored.revision
    again, kind = await apply_policy(store, PoolPolicy.parse(SPLIT.replace("40", "40.0")))
    assert kind == "unchanged" and again.revision == stored.revision
    assert (await store.get("v1/pools/split")) == entry
    assert [s.name for s in await list_policies(store)] == ["split"]
    assert (await get_policy(store, "split")).policy == policy


async def test_a_refused_or_overlapping_policy_stores_nothing(store: Store) -> None:
    await apply_policy(store, PoolPolicy.parse(SPLIT))
    other = PoolPolicy.parse(SPLIT.replace("name: split", "name: other"))
    with pytest.raises(PoolPolicyError, match="also owned by policy 'split'"):
        await apply_policy(store, other)
    disjoint = PoolPolicy.parse(
        SPLIT.replace("name: split", "name: other").replace("model=llama", "model=mistral")
    )
    await apply_policy(store, disjoint)
    entries, _ = await store.list("v1/pools")
    assert [e.key for e in entries] == ["v1/pools/other", "v1/pools/split"]


async def test_a_dry_run_checks_everything_and_writes_nothing(store: Store) -> None:
    stored, kind = await apply_policy(store, PoolPolicy.parse(SPLIT), dry_run=True)
    assert kind == "created" and stored.revision == 0
    assert await store.get("v1/pools/split") is None


async def test_pause_resume_remove_and_a_dropped_pool(store: Store) -> None:
    three = SPLIT + "  pool=batch: 10\n"
    await apply_policy(store, PoolPolicy.parse(three))
    stored, kind = await apply_policy(store, PoolPolicy.parse(SPLIT))
    assert kind == "changed" and stored.retired == {"pool=batch"}
    paused, changed = await set_paused(store, "split", True)
    assert changed and paused.policy.paused and paused.retired == {"pool=batch"}
    assert (await set_paused(store, "split", True))[1] is False
    resumed, changed = await set_paused(store, "split", False)
    assert changed and not resumed.policy.paused
    await store.put(history_key("split"), b"{}")
    removed = await remove_policy(store, "split")
    assert removed.policy.name == "split"
    assert await store.get("v1/pools/split") is None
    assert await store.get(history_key("split")) is None
    with pytest.raises(PolicyNotFoundError) as missing:
        await remove_policy(store, "split")
    assert missing.value.name == "split"
    with pytest.raises(PolicyNotFoundError):
        await get_policy(store, "Not a valid/key")


async def test_two_overlapping_stored_policies_reconcile_only_the_first_by_name(
    store: Store,
) -> None:
    """What two racing applies could leave behind (written here past the overlap check)."""
    from dynamod.pools.stored import encode

    for name in ("b", "a"):
        policy = PoolPolicy.parse(SPLIT.replace("name: split", f"name: {name}"))
        await store.put(policy.key, encode(policy))
    chosen, conflicts = in_force(await list_policies(store))
    assert [s.name for s in chosen] == ["a"]
    assert conflicts["b"].startswith("overlaps policy 'a'")


async def test_a_move_at_a_known_revision_is_one_compare_and_swap(store: Store) -> None:
    record, revision = await register(
        store, make_record(taints=["pool=slow"]), await store.grant(60)
    )
    move = TaintUpdate.replace(["pool=fast"])
    done = await update_taints(
        store, record.key, move, expect_revision=revision, base=record, base_revision=revision
    )
    assert done.after == ("pool=fast",) and done.revision > revision
    with pytest.raises(RevisionMismatchError):  # the record moved on: the CAS refuses
        await update_taints(
            store, record.key, move, expect_revision=revision, base=record, base_revision=revision
        )


async def test_a_new_policy_past_the_store_limit_is_refused_a_stored_one_still_changes() -> None:
    async with await open_store("memory://") as store:
        for i in range(MAX_POLICIES):
            p = PoolPolicy(f"p{i}", f"model=m{i}", {"pool=a": 1, "pool=b": 1})
            await store.put(p.key, encode(p))
        extra = PoolPolicy("extra", "model=x", {"pool=a": 1, "pool=b": 1})
        with pytest.raises(PoolPolicyError) as caught:
            await apply_policy(store, extra)
        assert str(caught.value).startswith(
            f"policy: the store holds {MAX_POLICIES} policies; the limit is {MAX_POLICIES}"
        )
        assert await store.get(extra.key) is None
        changed = PoolPolicy("p7", "model=m7", {"pool=a": 2, "pool=b": 1})
        assert (await apply_policy(store, changed))[1] == "changed"


async def test_a_deeply_nested_stored_value_is_refused_not_a_recursion_error() -> None:
    async with await open_store("memory://") as store:
        deep = b'{"policy": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"
        await store.put("v1/pools/deep", deep)
        assert await list_policies(store) == []  # logged and left out
        with pytest.raises(PoolPolicyError, match="stored policy at 'v1/pools/deep' is not a"):
            await get_policy(store, "deep")
