"""A stuck ``events tail`` client while taints change fast: the daemon neither blocks nor
grows without bound, other clients stay responsive, and the stuck client, once it reads
again, is brought back to the true state by a resync instead of a backlog, and never
sees an event older than one it already has."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench.common import owned
from bench.load import daemon_caught_up
from dynamod.client import AsyncClient
from dynamod.discovery.registration import register
from dynamod.discovery.updates import update_taints
from dynamod.store import Store, keep_alive, open_store
from dynamod.taints import TaintUpdate
from tests.chaos.harness import SETTLE, Figures
from tests.support.factories import make_record
from tests.support.processes import ROOT, Proc, daemon, env, running

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(180)]

FLEET = 16
TAINTS = 100  # per worker: each event is several kB on the wire
FLOOD = 4_000  # taint updates per round
HISTORY = 64  # the daemon's replay ring, kept small so it does not mask a backlog
# A queued event of these workers holds ~14 kB of Python objects (tracemalloc): the bounded
# subscription queue (1,024 events) is ~14 MB at most, a kept backlog of FLOOD ~57 MB.
RSS_GROWTH_LIMIT_MB = 40
PROBE_LIMIT = 2.0  # seconds a status call may take while the flood runs


def taints(round_: int) -> list[str]:
    return [f"chaos.example/t{j:03d}=r{round_}x{j}" for j in range(TAINTS)]


async def flood(store: Store, keys: list[str], start: int) -> int:
    """``FLOOD`` updates spread over the fleet, one writer per worker; the last revision."""
    revisions: list[int] = []

    async def writer(key: str) -> None:
        for n in range(start, start + FLOOD // len(keys)):
            result = await update_taints(store, key, TaintUpdate.replace(taints(n)))
            revisions.append(result.revision)

    async with asyncio.TaskGroup() as group:
        for key in keys:
            group.create_task(writer(key))
    return max(revisions)


class SlowTail:
    """The parent's side of ``tests/chaos/slow_tail.py``: its JSON lines, and its go."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process, self.stdin, self.stdout = process, process.stdin, process.stdout

    async def next(self) -> dict[str, Any]:
        async with asyncio.timeout(SETTLE):
            line = await self.stdout.readline()
        assert line, "the slow tail client exited early"
        found: dict[str, Any] = json.loads(line)
        return found

    def go(self) -> None:
        self.stdin.write(b"go\n")

    async def until(self, revision: int) -> list[dict[str, Any]]:
        lines = [await self.next()]
        while lines[-1]["revision"] < revision:
            lines.append(await self.next())
        return lines


@contextlib.asynccontextmanager
async def slow_tail(socket: Path) -> AsyncIterator[SlowTail]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.chaos.slow_tail", f"unix://{socket}",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=ROOT, env=env(),
    )  # fmt: skip
    try:
        yield SlowTail(process)
    finally:
        assert process.stdin is not None
        process.stdin.close()
        async with asyncio.timeout(SETTLE):
            await process.wait()


async def probe(client: AsyncClient, seconds: list[float]) -> None:
    """Status calls one after another until cancelled, each timed."""
    while True:
        started = time.perf_counter()
        await client.status()
        seconds.append(time.perf_counter() - started)


def fold(lines: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The state the slow client ends with, from its events."""
    state: dict[str, list[str]] = {}
    for line in lines:
        if line["kind"] == "RESYNC":
            state = dict(line["taints"])
        elif line["kind"] == "REMOVED":
            for key in line["taints"]:
                state.pop(key, None)
        else:
            state.update(line["taints"])
    return state


@contextlib.asynccontextmanager
async def fleet_and_daemon(
    url: str, tmp_path: Path
) -> AsyncIterator[tuple[Store, list[str], Proc, AsyncClient]]:
    """``FLEET`` registered records with ``TAINTS`` taints each, a dynamod over them with a
    small replay ring, and a client of it."""
    socket = tmp_path / "dynamod.sock"
    proc = daemon(url, socket, DYNAMO_EVENT_HISTORY=str(HISTORY))
    async with await open_store(url) as store:
        lease = await store.grant(60)
        async with owned(keep_alive(store, lease), "fleet lease"):
            records = [make_record(taints=taints(0)) for _ in range(FLEET)]
            keys = [(await register(store, r, lease))[0].key for r in records]
            async with running(proc), AsyncClient(f"unix://{socket}", timeout=5) as client:
                yield store, keys, proc, client


def stale(lines: list[dict[str, Any]]) -> list[str]:
    """``KIND@revision`` of each event that came after a newer one, the first few."""
    newest, found = 0, []
    for line in lines:
        if line["revision"] < newest:
            found.append(f"{line['kind']}@{line['revision']} after @{newest}")
        newest = max(newest, line["revision"])
    return found[:5]


def rss_mb(pid: int) -> float:
    rss: int = psutil.Process(pid).memory_info().rss
    return rss / 2**20


async def test_a_stuck_events_tail_neither_blocks_the_daemon_nor_grows_it(
    etcd_url: str, tmp_path: Path, figures: Figures
) -> None:
    async with fleet_and_daemon(etcd_url, tmp_path) as (store, keys, proc, client):
        # Round one warms the daemon (allocator, caches, the replay ring).
        await daemon_caught_up(client, await flood(store, keys, 1))
        before = rss_mb(proc.pid)
        async with slow_tail(tmp_path / "dynamod.sock") as tail:
            assert (await tail.next())["kind"] == "RESYNC"
            calls: list[float] = []
            async with owned(probe(client, calls), "status probe"):
                last = await flood(store, keys, 1 + FLOOD)
                # Another tail reaches the end at once: the daemon is not blocked.
                await daemon_caught_up(client, last)
            after = rss_mb(proc.pid)
            tail.go()
            lines = await tail.until(last)
            # One more change after the catch-up: whatever the stream still held comes
            # before it, so reading up to it reads everything.
            marker = await update_taints(store, keys[0], TaintUpdate.replace(taints(0)))
            lines += await tail.until(marker.revision)
        workers, _ = await client.list_workers()
    kinds = [line["kind"] for line in lines]
    figures.record("updates while stuck", FLOOD)
    figures.record("events the stuck client got", len(lines))
    figures.record("resyncs it got", kinds.count("RESYNC"))
    figures.record("daemon RSS before (MB)", round(before, 1))
    figures.record("daemon RSS after (MB)", round(after, 1))
    figures.record("status calls during the flood", len(calls))
    figures.record("slowest status call (ms)", round(max(calls) * 1e3, 2))
    assert "RESYNC" in kinds, "the stuck client was never resynced: its backlog was kept"
    revisions = [line["revision"] for line in lines]
    assert revisions == sorted(revisions), f"events older than one before them: {stale(lines)}"
    assert len(lines) < FLOOD / 2, f"the stuck client was sent {len(lines)} events"
    assert fold(lines) == {w.record.key: list(w.record.taints) for w in workers}
    assert max(calls) < PROBE_LIMIT, f"a status call took {max(calls):.2f} s"
    assert after - before < RSS_GROWTH_LIMIT_MB, f"RSS grew {after - before:.1f} MB"
    proc.assert_clean_stderr()


async def test_a_stuck_events_tail_that_is_killed_leaves_the_daemon_clean(
    etcd_url: str, tmp_path: Path
) -> None:
    """An operator kills a stuck ``events tail`` while the daemon waits to write to it:
    the daemon drops the stream quietly (no traceback) and keeps serving."""
    async with fleet_and_daemon(etcd_url, tmp_path) as (store, keys, proc, client):
        async with slow_tail(tmp_path / "dynamod.sock") as tail:
            assert (await tail.next())["kind"] == "RESYNC"
            await daemon_caught_up(client, await flood(store, keys, 1))
            tail.process.kill()
            await tail.process.wait()
        await daemon_caught_up(client, await flood(store, keys, 1 + FLOOD))
        await client.status()
    proc.assert_clean_stderr()
