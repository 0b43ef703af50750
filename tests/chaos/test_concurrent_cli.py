"""Sixteen ``dynamoctl taints add`` / ``taints rm`` processes at once on one worker: every
change a process reports done is in the final record, every change it reports failed is
not, and the store, the daemon's view and the worker itself agree on the result."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import pytest

from bench.load import daemon_caught_up
from dynamod.client import AsyncClient
from dynamod.records import WorkerRecord
from dynamod.store import open_store
from dynamod.taints import caller_taints
from tests.chaos.harness import Figures
from tests.support.processes import daemon, run_ctl, running, worker

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(180)]

PAIRS = 8  # 8 adders and 8 removers
SEEDS = [f"chaos.seed/s{i}" for i in range(PAIRS)]
ADDED = [f"chaos.cli/a{i}=v{i}" for i in range(PAIRS)]
EX_FAILED = 1  # dynamoctl: the operation failed (here: the retryable ABORTED)


def worker_view_of_itself(system: str) -> tuple[str, ...]:
    """The record the worker itself follows (``GET /metadata``)."""
    with urllib.request.urlopen(system + "/metadata", timeout=10) as reply:
        record = WorkerRecord.from_json(json.loads(reply.read())["record"])
    return caller_taints(record.taints)


async def test_sixteen_concurrent_dynamoctl_processes_lose_no_update(
    etcd_url: str, tmp_path: Path, figures: Figures
) -> None:
    socket = tmp_path / "dynamod.sock"
    seeds = [flag for t in SEEDS for flag in ("--taint", t)]
    async with running(worker(etcd_url, *seeds)) as proc, running(daemon(etcd_url, socket)):
        worker_id, key = proc.field("id"), proc.field("key")
        commands = [("taints", "add", worker_id, t) for t in ADDED]
        commands += [("taints", "rm", worker_id, t) for t in SEEDS]
        async with asyncio.TaskGroup() as group:
            runs = [group.create_task(run_ctl(socket, *c)) for c in commands]
        results = [r.result() for r in runs]
        for code, err in results:
            assert code in (0, EX_FAILED), err
            assert code == 0 or "ABORTED" in err or "retry" in err, err
        done = [c for c, (code, _) in zip(commands, results, strict=True) if code == 0]
        expected = set(SEEDS) - {c[3] for c in done if c[1] == "rm"}
        expected |= {c[3] for c in done if c[1] == "add"}

        async with await open_store(etcd_url) as store:
            entry = await store.get(key)
        assert entry is not None
        assert set(caller_taints(WorkerRecord.from_bytes(entry.value).taints)) == expected
        async with AsyncClient(f"unix://{socket}") as client:
            await daemon_caught_up(client, entry.revision)
            info = await client.get_worker(worker_id)
        assert set(info.caller_taints) == expected
        assert set(await asyncio.to_thread(worker_view_of_itself, proc.field("system"))) == (
            expected
        )
    figures.record("processes", len(commands))
    figures.record("succeeded", len(done))
    figures.record("refused as retryable", len(commands) - len(done))
    figures.record("final revision", entry.revision)
