"""The pool leader of a real dynamod on a real etcd: a single move is fenced on the store
too. The leader key is rewritten behind the leader's back with the same value and lease
(the leader's watch cannot tell: it names the same term), so only the store can see that
the key is no longer at the revision this term wrote it at. The next move is refused by
the store ("the term that made this write has ended", audited with the old epoch), the
term ends, and the daemon campaigns again: the move is made in a new term, a higher
epoch. On a store fenced by time only, the move would land in the old term."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dynamod.pools.leader import LEADER_KEY
from dynamod.store import KEEP, open_store
from tests.pools.live import MODEL, SOCKET, WORKER_TTL, pool_daemon
from tests.pools.test_pools_refused_live import attempts, ctl
from tests.support.eventually import eventually
from tests.support.processes import worker

pytestmark = pytest.mark.timeout(180)


def policy(pool: str) -> str:
    """One worker, all of it in ``pool`` (the other pool's share rounds to none)."""
    other = "pool=slow" if pool == "pool=fast" else "pool=fast"
    return f"name: one\nselector: model={MODEL}\npools:\n  {pool}: 9\n  {other}: 1\n"


async def test_a_single_move_after_the_leader_key_moved_is_refused_by_the_store(
    etcd_url: str, tmp_path: Path
) -> None:
    socket, audit_log = tmp_path / "d" / SOCKET, tmp_path / "d" / "audit.log"
    proc = pool_daemon(etcd_url, tmp_path / "d", "only")
    one = worker(etcd_url, "--lease-ttl", str(WORKER_TTL))
    await proc.start(within=60)
    try:
        await one.start(within=60)
        path = tmp_path / "one.yaml"

        async def apply(pool: str) -> None:
            path.write_text(policy(pool))
            applied = await asyncio.to_thread(ctl, socket, "pools", "apply", "-f", str(path))
            assert applied.returncode == 0, applied.stderr

        def moves_to(pool: str, outcome: str) -> list[dict[str, Any]]:
            return [
                line
                for line in attempts(audit_log)
                if line["move"]["to"] == pool and line["outcome"] == outcome
            ]

        async def lines() -> list[dict[str, Any]]:
            return attempts(audit_log)

        await apply("pool=fast")
        await eventually(
            lines, lambda _: bool(moves_to("pool=fast", "ok")), within=30, what="the first move"
        )
        [first] = moves_to("pool=fast", "ok")
        async with await open_store(etcd_url) as store:
            held = await store.get(LEADER_KEY)
            assert held is not None
            await store.put(LEADER_KEY, held.value, lease=KEEP)  # same term, new revision
        await apply("pool=slow")
        await eventually(
            lines, lambda _: bool(moves_to("pool=slow", "ok")), within=60, what="the move"
        )
        refused = moves_to("pool=slow", "NotLeaderError")
        assert refused, attempts(audit_log)
        assert all(line["epoch"] == first["epoch"] for line in refused), refused
        assert "term that made this write has ended" in refused[0]["error"], refused[0]
        [made] = moves_to("pool=slow", "ok")
        assert made["epoch"] > first["epoch"], made
    finally:
        await asyncio.gather(one.kill(), proc.kill())
    assert "Traceback" not in proc.stderr, proc.stderr


async def test_a_state_store_of_its_own_fences_by_time_and_still_moves(
    etcd_url: str, tmp_path: Path
) -> None:
    """The leader key on a ``state_store`` apart from the records' store: no transaction
    spans both, so the moves are fenced by time, and made (a guard on the records' store
    would name a key that is not there, and refuse every move)."""
    socket, audit_log = tmp_path / "d" / SOCKET, tmp_path / "d" / "audit.log"
    proc = pool_daemon(etcd_url, tmp_path / "d", "only", DYNAMO_STATE_STORE=f"{etcd_url}-state")
    one = worker(etcd_url, "--lease-ttl", str(WORKER_TTL))
    await proc.start(within=60)
    try:
        await one.start(within=60)
        path = tmp_path / "one.yaml"
        path.write_text(policy("pool=fast"))
        applied = await asyncio.to_thread(ctl, socket, "pools", "apply", "-f", str(path))
        assert applied.returncode == 0, applied.stderr

        async def lines() -> list[dict[str, Any]]:
            return attempts(audit_log)

        tried = await eventually(lines, bool, within=30, what="the move")
        assert [line["outcome"] for line in tried] == ["ok"], tried
    finally:
        await asyncio.gather(one.kill(), proc.kill())
    assert "Traceback" not in proc.stderr, proc.stderr
