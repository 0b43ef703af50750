"""The pool API end to end in one process: a real Daemon on real sockets, the async and the
blocking client. Apply, list, get, status, pause, resume, remove; refusals keep their
fields across the wire; every write is audited; pool events in ``events tail``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from dynamod.client import AsyncClient, Client, Credentials
from dynamod.discovery.updates import update_taints
from dynamod.errors import (
    PermissionDeniedError,
    PolicyNotFoundError,
    PoolPolicyError,
)
from dynamod.reports import EventInfo
from dynamod.store import Store, open_store
from dynamod.taints import TaintUpdate
from tests.daemon.helpers import add_worker, client_for, running_daemon, settings_for
from tests.support.eventually import eventually

pytestmark = pytest.mark.timeout(60)

SPLIT = """
name: split
selector: model=llama
pools:
  pool=fast: 40
  pool=slow: 60
"""


@pytest.fixture
async def memory() -> Any:
    async with await open_store("memory://") as store:
        yield store


async def until_balanced(client: AsyncClient, name: str, within: float = 10.0) -> Any:
    """The policy's status once nothing is pending and every count is met."""
    return await eventually(
        lambda: client.pool_status(name),
        lambda s: s.balanced and all(c.wanted == c.actual for c in s.pools),
        within=within,
        what=f"{name} balanced",
    )


def audit_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_apply_status_pause_resume_and_remove_through_the_api(
    memory: Store, tmp_path: Path
) -> None:
    for _ in range(5):
        await add_worker(memory)
    settings = settings_for(memory, tmp_path, pool_lease_ttl=2.0, store_timeout=1.0)
    async with running_daemon(memory, settings) as daemon, client_for(settings) as client:
        preview = await client.apply_policy(SPLIT, dry_run=True)
        assert preview.outcome == "created" and preview.dry_run
        assert sorted(m.to_pool for m in preview.moves) == ["pool=fast"] * 2 + ["pool=slow"] * 3
        assert await client.list_policies() == []

        applied = await client.apply_policy(SPLIT)
        assert applied.outcome == "created" and applied.policy.revision > 0
        again = await client.apply_policy(SPLIT)
        assert again.outcome == "unchanged" and again.policy.revision == applied.policy.revision
        [listed] = await client.list_policies()
        assert listed == applied.policy == await client.get_policy("split")
        assert listed.pools == {"pool=fast": 40, "pool=slow": 60}

        status = await until_balanced(client, "split")
        assert [(c.pool, c.wanted, c.actual) for c in status.pools] == [
            ("pool=fast", 2, 2), ("pool=slow", 3, 3),
        ]  # fmt: skip
        assert status.leading and status.leader == settings.replica_id and status.epoch > 0
        assert status.workers == 5 and status.conflict == ""
        done = await eventually(
            lambda: client.pool_status("split"), lambda s: len(s.recent) == 5, what="5 moves"
        )
        recent = done.recent
        assert {m.why for m in recent} == {"joined"}
        assert {m.epoch for m in recent} == {status.epoch}
        metrics = generate_latest(daemon.registry).decode()
        for line in (
            'dynamod_pool_target_workers{policy="split",pool="pool=fast"} 2.0',
            'dynamod_pool_workers{policy="split",pool="pool=slow"} 3.0',
            'dynamod_pool_pending_moves{policy="split"} 0.0',
            'dynamod_pool_moves_total{policy="split",why="joined"} 5.0',
            "dynamod_pool_leader 1.0",
            f"dynamod_pool_leader_epoch {float(status.epoch)}",
        ):
            assert line in metrics, line

        paused, changed = await client.pause_policy("split")
        assert paused.paused and changed
        assert (await client.pause_policy("split"))[1] is False
        resumed, changed = await client.resume_policy("split")
        assert not resumed.paused and changed

        removed = await client.remove_policy("split")
        assert removed.policy.name == "split" and removed.workers_holding == 5
        with pytest.raises(PolicyNotFoundError) as missing:
            await client.get_policy("split")
        assert missing.value.name == "split"

    lines = audit_lines(tmp_path / "audit.log")
    moves = [line for line in lines if line.get("pool_policy") == "split" and "move" in line]
    assert len(moves) == 5
    assert {line["epoch"] for line in moves} == {status.epoch}
    assert all(line["sent"] <= line["time"] for line in moves)  # sent in the term, then logged
    assert {line["caller"] for line in moves} == {f"pools@{settings.replica_id}"}
    actions = [line["action"] for line in lines if line["action"].startswith("pool-")]
    assert actions == ["pool-apply", "pool-apply", "pool-pause", "pool-pause", "pool-resume",
                       "pool-remove"]  # fmt: skip


async def test_refusals_keep_their_fields_and_store_nothing(memory: Store, tmp_path: Path) -> None:
    settings = settings_for(memory, tmp_path)
    async with running_daemon(memory, settings), client_for(settings) as client:
        with pytest.raises(PoolPolicyError) as refused:
            await client.apply_policy(SPLIT.replace("60", "-1"))
        assert str(refused.value).startswith("pools: weight of 'pool=slow' must be a positive")
        await client.apply_policy(SPLIT)
        overlapping = SPLIT.replace("name: split", "name: other")
        with pytest.raises(PoolPolicyError, match="also owned by policy 'split'"):
            await client.apply_policy(overlapping)
        assert [p.name for p in await client.list_policies()] == ["split"]
        with pytest.raises(PolicyNotFoundError) as missing:
            await client.pool_status("nope")
        assert missing.value.name == "nope"
        await asyncio.to_thread(blocking_calls, settings.listen[0])
    refusals = [line for line in audit_lines(tmp_path / "audit.log") if "error" in line]
    assert [line["outcome"] for line in refusals] == ["PoolPolicyError", "PoolPolicyError"]


def blocking_calls(endpoint: str) -> None:
    """The blocking client's pool calls, and an error with its fields (in a thread: the
    daemon runs on the test's loop)."""
    with Client(endpoint, credentials=Credentials(), timeout=10) as blocking:
        with pytest.raises(PolicyNotFoundError) as missing:
            blocking.remove_policy("nope")
        assert missing.value.name == "nope"
        assert [p.name for p in blocking.list_policies()] == ["split"]
        assert blocking.pool_status("split").policy.name == "split"


async def test_a_token_limited_to_prefixes_cannot_own_other_taints(
    memory: Store, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        '[[token]]\nname = "pools"\nsecret = "s3cret-pools"\nrole = "write"\n'
        'prefixes = ["pool=fast", "pool=slow"]\n'
        '[[token]]\nname = "reader"\nsecret = "r34d-only-token"\nrole = "read"\n'
    )
    settings = settings_for(memory, tmp_path, tokens_file=tokens)
    async with running_daemon(memory, settings):
        async with client_for(settings, token="s3cret-pools") as allowed:
            await allowed.apply_policy(SPLIT)
            with pytest.raises(PermissionDeniedError):
                await allowed.apply_policy(SPLIT.replace("pool=slow", "pool=batch"))
        async with client_for(settings, token="r34d-only-token") as reader:
            assert (await reader.apply_policy(SPLIT, dry_run=True)).outcome == "unchanged"
            with pytest.raises(PermissionDeniedError):
                await reader.pause_policy("split")


async def test_pool_events_join_the_tail_and_moves_carry_the_epoch(
    memory: Store, tmp_path: Path
) -> None:
    worker = await add_worker(memory)
    await add_worker(memory)
    settings = settings_for(memory, tmp_path, pool_lease_ttl=2.0, store_timeout=1.0)
    async with running_daemon(memory, settings), client_for(settings) as client:
        start = (await client.status()).revision
        tail = client.tail_events(since=start, pools=True)
        seen: list[EventInfo] = []

        async def until(kind: str, count: int = 1) -> list[EventInfo]:
            async with asyncio.timeout(10):
                while sum(1 for e in seen if e.pool and e.pool.kind == kind) < count:
                    seen.append(await anext(tail))
            return [e for e in seen if e.pool and e.pool.kind == kind]

        await client.apply_policy(SPLIT.replace("40", "50").replace("60", "50"))
        [applied] = await until("APPLIED")
        assert applied.kind == "POOL" and applied.pool and applied.pool.policy == "split"
        moved = await until("MOVED", 2)
        assert all(e.pool and e.pool.epoch > 0 and e.pool.why == "joined" for e in moved)
        held = next(e.pool.to_pool for e in moved if e.pool and e.pool.worker == worker.instance_id)
        await update_taints(memory, worker.key, TaintUpdate.remove([held]))
        [drift] = await until("DRIFT")
        assert drift.pool is not None and drift.pool.worker == worker.instance_id
        assert drift.pool.why == "put back" and drift.pool.to_pool == held
        await until("MOVED", 3)
        taints = [e for e in seen if e.kind == "TAINTS"]
        assert taints, "worker events come in the same stream"
        await tail.aclose()

        old = [e async for e in client.tail_events(since=start, pools=True, follow=False)]
        kinds = [e.pool.kind for e in old if e.pool and e.pool.policy]
        assert kinds[:1] == ["APPLIED"] and kinds.count("DRIFT") == 1
        revisions = [e.revision for e in old]
        assert revisions == sorted(revisions)
        plain = [e async for e in client.tail_events(since=start, follow=False)]
        assert all(e.kind != "POOL" for e in plain)
