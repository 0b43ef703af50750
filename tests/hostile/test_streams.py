"""API streams and selectors under hostile callers, with real processes.

A client with a read-only token opens 500 ``TailEvents`` streams and never reads one
(``unread_streams.py``): the daemon keeps its limit of streams per caller, refuses the rest
with ``RESOURCE_EXHAUSTED`` naming the limit, stays small, and keeps answering honest
callers; a stream past the daemon-wide limit is refused the same way. A stuck ``events
tail`` is sent back to a resync once its queue passes its byte bound, long before its
count bound. A selector over its limits (characters, terms) is refused before it is
parsed, over gRPC and in dynamoctl.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench.common import owned
from dynamod.client import AsyncClient, Credentials
from dynamod.discovery.registration import register
from dynamod.discovery.updates import update_taints
from dynamod.errors import SelectorError, StreamLimitError
from dynamod.reports import EventInfo
from dynamod.selectors import MAX_SELECTOR, MAX_TERMS
from dynamod.store import Store, keep_alive, open_store
from dynamod.taints import TaintUpdate
from dynamod.targets import Target
from tests.support.factories import make_record
from tests.support.processes import ROOT, Proc, daemon, dynamoctl, env, running
from tests.support.servers import free_port

pytestmark = pytest.mark.timeout(240)

FLEET = 200
TAINTS = 20  # per worker: a RESYNC of the fleet is about 0.6 MB on the wire
ATTACK = 500
PER_CALLER = 16
DAEMON_WIDE = 24
# Measured: 500 unread streams of this fleet grew the daemon by 440 MB before the limits;
# 32 of them (each holding one RESYNC) by 55 MB.
RSS_GROWTH_LIMIT_MB = 150
TOKENS = """
[[token]]
name = "viewer"
secret = "viewer-secret-1"

[[token]]
name = "other-viewer"
secret = "other-secret-1"
"""


@dataclass
class Fleet:
    store: Store
    keys: list[str]
    daemon: Proc
    tcp: str
    unix: str


def taints(round_: int, count: int = TAINTS) -> list[str]:
    return [f"hostile.example/t{j:04d}=r{round_}-" + "x" * 20 for j in range(count)]


@contextlib.asynccontextmanager
async def fleet(
    tmp_path: Path, *args: str, workers: int = FLEET, **env: str
) -> AsyncIterator[Fleet]:
    """``workers`` records in a file store, and a dynamod over them on a unix socket and
    a TCP port that asks for tokens (``TOKENS``)."""
    (tmp_path / "tokens.toml").write_text(TOKENS)
    url = (tmp_path / "store").as_uri()
    socket, port = tmp_path / "d.sock", free_port()
    tcp = ("--listen", f"127.0.0.1:{port}", "--tokens-file", str(tmp_path / "tokens.toml"))
    async with await open_store(url) as store:
        lease = await store.grant(60)
        async with owned(keep_alive(store, lease), "fleet lease"):
            records = [make_record(taints=taints(0)) for _ in range(workers)]
            keys = [(await register(store, r, lease))[0].key for r in records]
            proc = daemon(url, socket, *tcp, *args, **env)
            async with running(proc):
                yield Fleet(store, keys, proc, f"127.0.0.1:{port}", f"unix://{socket}")
                proc.assert_clean_stderr()


@contextlib.asynccontextmanager
async def unread_tails(endpoint: str, token: str, streams: int) -> AsyncIterator[dict[str, Any]]:
    """``unread_streams.py`` holding ``TailEvents`` streams open; its report."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.hostile.unread_streams", endpoint, token, str(streams),
        stdout=asyncio.subprocess.PIPE, cwd=ROOT, env=env(),
    )  # fmt: skip
    assert process.stdout is not None
    try:
        async with asyncio.timeout(120):
            line = await process.stdout.readline()
        assert line, "the hostile client exited before it reported"
        yield json.loads(line)
    finally:
        process.kill()
        await process.wait()


def rss_mb(pid: int) -> float:
    rss: int = psutil.Process(pid).memory_info().rss
    return rss / 2**20


async def peak_rss_mb(pid: int, samples: int = 10) -> float:
    """The largest of ``samples`` readings a fifth of a second apart: the daemon writes
    to the streams it kept on its own time."""
    peak = 0.0
    for _ in range(samples):
        peak = max(peak, rss_mb(pid))
        await asyncio.sleep(0.2)
    return peak


async def ctl(endpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = dynamoctl("--endpoint", endpoint, *args)
    return await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, env=env(), timeout=60
    )


async def open_tails(client: AsyncClient, count: int, stack: contextlib.AsyncExitStack) -> None:
    """``count`` event streams of ``client``, each past its first event, held open by
    ``stack``."""
    for _ in range(count):
        events = await stack.enter_async_context(contextlib.aclosing(client.tail_events()))
        await anext(events)


async def test_unread_event_streams_are_limited_and_the_daemon_stays_small(
    tmp_path: Path,
) -> None:
    async with fleet(tmp_path, DYNAMO_MAX_STREAMS=str(DAEMON_WIDE)) as f:
        before = rss_mb(f.daemon.pid)
        async with unread_tails(f.tcp, "viewer-secret-1", ATTACK) as report:
            peak = await peak_rss_mb(f.daemon.pid)
            assert report["open"] == PER_CALLER, report
            assert report["refused"] == {"RESOURCE_EXHAUSTED": ATTACK - PER_CALLER}
            (detail,) = report["details"]
            assert f"'viewer' already has {PER_CALLER} API streams open" in detail
            assert f"max_streams_per_caller = {PER_CALLER}" in detail
            assert peak - before < RSS_GROWTH_LIMIT_MB, f"RSS grew {peak - before:.0f} MB"

            listed = await ctl(f.unix, "workers", "ls", "-o", "name")
            assert listed.returncode == 0, listed.stderr
            assert len(listed.stdout.splitlines()) == FLEET
            viewer = Credentials(token="viewer-secret-1")
            async with AsyncClient(f.tcp, credentials=viewer, timeout=30) as client:
                assert len((await client.list_workers())[0]) == FLEET  # unary: no slot
                with pytest.raises(StreamLimitError) as refused:
                    await anext(aiter(client.tail_events()))
                assert (refused.value.setting, refused.value.limit) == (
                    "max_streams_per_caller", PER_CALLER
                )  # fmt: skip

            other = Credentials(token="other-secret-1")
            async with (
                AsyncClient(f.tcp, credentials=other, timeout=30) as client,
                contextlib.AsyncExitStack() as held,
            ):
                await open_tails(client, DAEMON_WIDE - PER_CALLER, held)
                with pytest.raises(StreamLimitError) as refused:
                    await anext(aiter(client.tail_events()))
                said = str(refused.value)
                assert said.startswith(f"dynamod already has {DAEMON_WIDE} API streams open")
                assert (refused.value.setting, refused.value.limit) == ("max_streams", DAEMON_WIDE)
                assert refused.value.retryable
        # The hostile client is gone: its streams are free again.
        listed = await ctl(f.unix, "events", "tail", "--no-follow", "-o", "json")
        assert listed.returncode == 0, listed.stderr


async def test_a_stuck_tail_is_resynced_by_bytes_long_before_its_count_bound(
    tmp_path: Path,
) -> None:
    """A tail that stops reading while taints change: each event is ~25 kB by the view's
    estimate, and the event queues may hold 1 MB in all, so the stuck tail is sent back to
    a resync after some 40 events queued — far under the 1,024 events a queue may hold.
    Reading again, it ends with the true state."""
    updates = 400
    async with (
        fleet(tmp_path, workers=4, DYNAMO_EVENT_QUEUES_MB="1") as f,
        AsyncClient(f.unix, credentials=Credentials(), timeout=30) as client,
        contextlib.aclosing(client.tail_events()) as events,
    ):
        seen = [await anext(events)]  # the first RESYNC; then nothing is read for a while
        last = 0
        for n in range(1, updates + 1):
            key = f.keys[n % len(f.keys)]
            change = await update_taints(f.store, key, TaintUpdate.replace(taints(n, 300)))
            last = change.revision
        while seen[-1].revision < last:
            async with asyncio.timeout(30):
                seen.append(await anext(events))
        workers, _ = await client.list_workers()
    kinds = [event.kind for event in seen]
    assert "RESYNC" in kinds[1:], f"no resync in {len(kinds)} events: the backlog was kept"
    assert len(seen) < updates
    assert state(seen) == {w.record.key: w.record.taints for w in workers}


def state(events: list[EventInfo]) -> dict[str, tuple[str, ...]]:
    """The taints of each worker, as a client following ``events`` knows them."""
    known: dict[str, tuple[str, ...]] = {}
    for event in events:
        if event.kind == "RESYNC":
            known = {w.record.key: w.record.taints for w in event.workers}
        elif event.worker is not None and event.kind == "REMOVED":
            known.pop(event.worker.record.key, None)
        elif event.worker is not None:
            known[event.worker.record.key] = event.worker.record.taints
    return known


async def test_a_selector_over_its_limit_is_refused_before_it_is_parsed(
    tmp_path: Path,
) -> None:
    over = "a," * (MAX_SELECTOR // 2) + "a"  # 32,769 good terms: one character too many
    said = f"is over the limit of {MAX_SELECTOR} characters"
    async with (
        fleet(tmp_path, workers=2) as f,
        AsyncClient(f.unix, credentials=Credentials(), timeout=30) as client,
    ):
        with pytest.raises(SelectorError, match=said):
            await client.list_workers(selector=over)
        with pytest.raises(SelectorError, match=said):
            await anext(aiter(client.tail_events(selector=over)))
        with pytest.raises(SelectorError, match=said):
            await client.update_taints(TaintUpdate.add(["x"]), Target(selector=over))
        many = ",".join(f"t{i}" for i in range(MAX_TERMS + 1))
        with pytest.raises(SelectorError, match=f"has 257 terms, over the limit of {MAX_TERMS}"):
            await client.list_workers(selector=many)
        # Larger than any request the API takes: gRPC refuses it before the daemon reads it.
        with pytest.raises(Exception, match="RESOURCE_EXHAUSTED"):
            await client.list_workers(selector="a" * (40 * 2**20))
        assert len((await client.list_workers(selector="model=llama"))[0]) == 2

        result = await ctl(f.unix, "workers", "ls", "-l", over)
        assert result.returncode == 1, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert said in line
