"""A pool leader killed after the store committed its moves and before it logged them: the
next leader finds the batch's intent in the history and writes the moves into the log at
its start, marked reconciled, with the epoch and the time they were sent.

The window is made real, and held open, with the leader's own audit log: a FIFO whose pipe
the test fills before the policy is applied, so the first audit line after the moves'
transaction blocks the leader's process in its write (as a log on a full, or hung, disk
would). The test sees the moves in the store, SIGKILLs the leader, and the other daemon,
a follower until then, leads."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dynamod.pools.history import decode, history_key
from dynamod.pools.leader import read_leader
from dynamod.pools.policy import PoolPolicy
from dynamod.store import open_store
from tests.pools.live import MODEL, SOCKET, WORKER_TTL, Daemon, held_now, pool_daemon
from tests.pools.test_pools_refused_live import ctl
from tests.support.eventually import eventually
from tests.support.processes import worker

pytestmark = pytest.mark.timeout(180)

WORKERS = 3


@contextlib.contextmanager
def held_pipe(fifo: Path) -> Iterator[tuple[int, int]]:
    """The read end of ``fifo`` (opened first, so a daemon's open of its log does not wait)
    and a write end of the test's own, both closed on exit."""
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        yield reader, writer
    finally:
        os.close(writer)
        os.close(reader)


def drain(reader: int) -> bytes:
    """Whatever the pipe holds now."""
    out = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(reader, 65536):
            out += chunk
    return out


def fill(writer: int) -> None:
    """Fill the pipe to the last byte: the next write into it blocks."""
    for size in (65536, 4096, 1):
        with contextlib.suppress(BlockingIOError):
            while os.write(writer, b"\0" * size):
                pass


def audit_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_moves_committed_by_a_leader_killed_before_its_audit_lines_are_reconciled(
    etcd_url: str, tmp_path: Path
) -> None:
    leader_proc = pool_daemon(etcd_url, tmp_path / "a", "a")
    fifo = tmp_path / "a" / "audit.log"
    os.mkfifo(fifo)
    other = Daemon("b", pool_daemon(etcd_url, tmp_path / "b", "b"), tmp_path / "b" / SOCKET)
    workers = [worker(etcd_url, "--lease-ttl", str(WORKER_TTL)) for _ in range(WORKERS)]
    policy_path = tmp_path / "split.yaml"
    text = f"name: split\nselector: model={MODEL}\npools:\n  pool=fast: 1\n  pool=slow: 2\n"
    policy = PoolPolicy.parse(text)
    with held_pipe(fifo) as (reader, writer):
        await leader_proc.start(within=60)
        try:
            async with await open_store(etcd_url) as store:
                # a policy over no worker makes "a" the leader before "b" starts
                policy_path.write_text(
                    "name: warm\nselector: model=none\npools:\n  p=a: 1\n  p=b: 1\n"
                )
                warm = await asyncio.to_thread(
                    ctl, tmp_path / "a" / SOCKET, "pools", "apply", "-f", str(policy_path)
                )
                assert warm.returncode == 0, warm.stderr

                async def leader() -> str | None:
                    found = await read_leader(store)
                    return None if found is None else found.identity

                await eventually(leader, lambda who: who == "a", within=30, what="a leads")
                await other.proc.start(within=60)
                await asyncio.gather(*(w.start(within=60) for w in workers))
                assert b"pool-apply" in drain(reader)
                fill(writer)

                policy_path.write_text(text)
                applied = await asyncio.to_thread(
                    ctl, other.socket, "pools", "apply", "-f", str(policy_path)
                )
                assert applied.returncode == 0, applied.stderr
                async with other.client() as client:
                    held = await eventually(
                        lambda: held_now(client, policy),
                        lambda h: len(h) == WORKERS and None not in h.values(),
                        within=30, what="the moves in the store",
                    )  # fmt: skip
                await leader_proc.kill()  # blocked in its first audit line after the moves

                def reconciled(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
                    return [line for line in lines if "reconciled" in line]

                lines = await eventually(
                    lambda: asyncio.to_thread(audit_lines, other.audit_log),
                    lambda found: len(reconciled(found)) == WORKERS,
                    within=60, what="the reconciled audit lines",
                )  # fmt: skip
                entry = await store.get(history_key("split"))
                assert entry is not None
                history = decode(entry)
                status = await asyncio.to_thread(
                    ctl, other.socket, "pools", "status", "split", "-o", "json"
                )
        finally:
            await asyncio.gather(
                other.proc.kill(), leader_proc.kill(), *(w.kill() for w in workers)
            )
    assert history is not None
    assert not history.intents, history.intents
    moves = {m.worker: m for _, m in history.moves}
    assert {w: m.to_pool for w, m in moves.items()} == held, history
    assert {m.reconciled for m in moves.values()} == {"b"}, moves
    assert {m.leader for m in moves.values()} == {"a"}, moves
    for line in reconciled(lines):
        assert line["outcome"] == "ok" and line["leader"] == "a", line
        assert line["worker"] in held and line["move"]["to"] == held[line["worker"]], line
        assert line["reconciled"]["by"] == "b", line
        assert line["reconciled"]["epoch"] > line["epoch"], line
        assert line["sent"] < line["time"], line
    assert status.returncode == 0, status.stderr
    recent = json.loads(status.stdout)["recent"]
    assert {m["worker"]: m.get("reconciled") for m in recent} == dict.fromkeys(held, "b"), recent
    assert "Traceback" not in other.proc.stderr, other.proc.stderr
