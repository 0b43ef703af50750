"""A real ``dynamod`` following a fleet's engine events streams: past aiohttp's default 100
connections, past systemd's default soft limit of 1,024 open files, and through a partition.

The fleet: one real mocker worker (``dynamo-worker``) and ``FLEET`` records cloned from its
record in etcd, each pointing at its own stream on one ``bench.stream_server`` (which
relays the rest of a worker's system routes, its tokenizer bundle, to the real worker).
Each daemon is started under ``prlimit`` with a soft limit of 1,024 open files, as systemd
starts a service whose unit sets none. What is sampled (the daemon's metrics, the stream
server's counts) is held until seen (``eventually``); nothing here measures time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from dynamod.discovery.registration import new_instance_id, register
from dynamod.records import WorkerRecord
from dynamod.store import open_store
from tests.support.eventually import eventually
from tests.support.processes import Spawned, daemon_argv, dynamoctl, env, started, worker_argv
from tests.support.scrape import scrape
from tests.support.servers import EtcdServer

# solo: 1,101 streams and a raised open-files limit want the machine to themselves (a
# sampled test beside them, the KV flood's, waited in vain for its evictions).
pytestmark = [pytest.mark.etcd, pytest.mark.solo, pytest.mark.timeout(300)]

FLEET = 1_100
"""Cloned workers: more than aiohttp's default connector takes (100), more streams than a
soft limit of 1,024 open files holds."""
WITHIN = 120.0
"""Seconds a sampled condition may take: a fleet connects on two shared, busy cores."""
HELD_BEATS = 4
"""Heartbeats (2 s apart) every open stream must have sent: past the daemon's line deadline
(6 s), so a stream that waited for a connection would have been marked by then."""


@dataclass(frozen=True)
class Fleet:
    store: str
    streams: Spawned
    honest: Spawned
    where: Path

    @property
    def size(self) -> int:
        return FLEET + 1  # the clones and the real worker


def clones(record: WorkerRecord, streams: str, count: int) -> list[WorkerRecord]:
    return [
        dataclasses.replace(record, instance_id=new_instance_id(), system_address=f"{streams}/w{i}")
        for i in range(count)
    ]


async def register_clones(store_url: str, key: str, streams: str) -> None:
    store = await open_store(store_url)
    try:
        entry = await store.get(key)
        assert entry is not None, f"the real worker's record {key} is not in the store"
        lease = await store.grant(3600)
        gate = asyncio.Semaphore(64)

        async def one(record: WorkerRecord) -> None:
            async with gate:
                await register(store, record, lease)

        async with asyncio.TaskGroup() as group:
            for record in clones(WorkerRecord.from_bytes(entry.value), streams, FLEET):
                group.create_task(one(record))
    finally:
        await store.aclose()


@pytest.fixture(scope="module")
def fleet(etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    where = tmp_path_factory.mktemp("fleet-streams")
    store = etcd_server.url(f"t-fleet-{uuid.uuid4().hex[:12]}")
    honest = started(worker_argv(store, "llama"), r"^dynamo-worker ready:", where / "worker.err")
    try:
        argv = [sys.executable, "-m", "bench.stream_server", "--upstream", honest.field("system")]
        streams = started(argv, r"^stream server ready:", where / "streams.err")
        try:
            asyncio.run(register_clones(store, honest.field("key"), streams.field("http")))
            yield Fleet(store, streams, honest, where)
        finally:
            streams.finish()
    finally:
        honest.finish()


@contextlib.asynccontextmanager
async def daemon(fleet: Fleet, name: str, nofile: str = "1024:4096") -> AsyncIterator[Spawned]:
    """A daemon started with the open-files limits ``nofile`` (soft:hard), once it follows
    its first snapshot; stopped (its stderr checked) on the way out."""
    argv = ["prlimit", f"--nofile={nofile}", "--", *daemon_argv(fleet.store, fleet.where / name)]
    proc = await asyncio.to_thread(started, argv, r"^dynamod ready:", fleet.where / f"{name}.err")
    try:
        yield proc
    finally:
        await asyncio.to_thread(proc.finish)


async def metrics(proc: Spawned) -> dict[str, float]:
    async with aiohttp.ClientSession() as http:
        return await scrape(http, proc.field("http") + "/metrics")


async def stream_stats(fleet: Fleet) -> dict[str, Any]:
    url = fleet.streams.field("http") + "/stats"
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        stats: dict[str, Any] = await response.json()
    return stats


async def following(fleet: Fleet, proc: Spawned) -> dict[str, float]:
    """Wait until the stream server has every clone's stream open and ``proc`` follows
    every worker's, none marked; its metrics (``server_open``: the server's count)."""

    async def probe() -> dict[str, float]:
        found = await metrics(proc)
        found["server_open"] = (await stream_stats(fleet))["open"]
        return shown(found)

    def accept(found: dict[str, float]) -> bool:
        return (
            found["server_open"] == FLEET
            and found.get("dynamod_engine_streams_open") == fleet.size
            and found.get("dynamod_workers_marked") == 0
        )

    def shown(found: dict[str, float]) -> dict[str, float]:
        keep = ("server_open", "dynamod_engine_streams_open", "dynamod_workers_marked")
        return {k: v for k, v in found.items() if k in keep or "breaches_total" in k}

    return await eventually(probe, accept, within=WITHIN, every=0.5, what="every stream open")


async def held(fleet: Fleet) -> None:
    """Wait until every stream the server has open has sent ``HELD_BEATS`` heartbeats."""

    async def least() -> int:
        return int((await stream_stats(fleet))["least"])

    await eventually(least, lambda n: n >= HELD_BEATS, within=WITHIN, every=0.5, what="held")


async def ctl(fleet: Fleet, socket: str, *args: str) -> str:
    """``dynamoctl`` against the daemon at ``socket``: its stdout (exit 0 asserted)."""
    argv = dynamoctl("--endpoint", f"unix://{fleet.where / socket}", *args)
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env()
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return out.decode()


def breaches(found: dict[str, float]) -> float:
    return sum(v for k, v in found.items() if k.startswith("dynamod_worker_breaches_total"))


async def assert_routes(proc: Spawned) -> None:
    body = {"model": "llama", "prompt": "a b c d", "max_tokens": 2}
    url, timeout = proc.field("http") + "/v1/completions", aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as http, http.post(url, json=body) as answer:
        assert answer.status == 200, await answer.text()


async def test_a_daemon_at_a_soft_limit_of_1024_raises_it_and_follows_every_stream(
    fleet: Fleet,
) -> None:
    """1,101 streams, none waiting for a connection: none marked, no breach at all, once
    each has stayed open past the line deadline."""
    async with daemon(fleet, "raised.sock") as proc:
        await following(fleet, proc)
        assert "open files: soft limit raised from 1024 to 4096 (hard limit 4096)" in proc.log
        await held(fleet)
        found = await metrics(proc)
        assert breaches(found) == 0 and found["dynamod_workers_marked"] == 0
        assert found["dynamod_open_files_limit"] == 4096
        assert fleet.size < found["dynamod_open_files"] < 4096
        assert found["dynamod_engine_streams_refused_total"] == 0
        await assert_routes(proc)
        assert re.search(
            r"^Open files: +\d+ of 4096$", await ctl(fleet, "raised.sock", "status"), re.M
        )
        shown = json.loads(await ctl(fleet, "raised.sock", "status", "-o", "json"))["open_files"]
        assert shown["limit"] == 4096 and fleet.size < shown["open"] < 4096


async def test_a_fleet_beyond_the_open_files_limit_is_refused_streams_not_files(
    fleet: Fleet,
) -> None:
    """A hard limit of 1,024: the daemon opens as many streams as fit (the limit less its
    reserve), counts and logs the rest as refused, and its store, gRPC and front go on."""
    async with daemon(fleet, "capped.sock", nofile="1024:1024") as proc:
        found = await eventually(
            lambda: metrics(proc),
            lambda m: (
                m.get("dynamod_engine_streams_refused_total", 0) > 0
                and m.get("dynamod_engine_streams_open") == 1024 - 256
            ),
            within=WITHIN,
            every=0.5,
            what="streams refused past the bound",
        )
        assert found["dynamod_open_files_limit"] == 1024
        assert "engine stream not opened: 768 are open" in proc.log
        assert "raise LimitNOFILE" in proc.log
        assert found["dynamod_workers_marked"] == 0  # refused is not a breach
        await assert_routes(proc)
    assert "Too many open files" not in proc.log


async def test_a_frozen_stream_server_costs_a_bounded_log_and_every_mark_lifts(
    fleet: Fleet,
) -> None:
    """Every stream silent for 10 s (their server stopped), then back: each worker is marked
    ``timeout``, the daemon logs a few summary lines rather than one per worker, and every
    mark lifts once the streams are healthy again."""
    async with daemon(fleet, "frozen.sock") as proc:
        await following(fleet, proc)
        before = len(proc.log.splitlines())
        fleet.streams.proc.send_signal(signal.SIGSTOP)
        try:
            await eventually(
                lambda: metrics(proc),
                lambda m: m.get("dynamod_workers_marked", 0) >= FLEET,
                within=WITHIN,
                every=0.5,
                what="every clone marked",
            )
            await asyncio.sleep(10 - 6)  # the rest of the 10 s freeze (6 s: the line deadline)
        finally:
            fleet.streams.proc.send_signal(signal.SIGCONT)
        found = await following(fleet, proc)
        assert found['dynamod_worker_breaches_total{kind="timeout"}'] >= FLEET

        async def summarised() -> list[str] | None:
            lines = proc.log.splitlines()[before:]
            lifted = [line for line in lines if "more workers are within" in line]
            return lines if lifted and "more workers were marked (timeout)" in proc.log else None

        lines = await eventually(summarised, within=WITHIN, what="the summary lines")
        assert len(lines) <= 40, "\n".join(lines[:60])
        await assert_routes(proc)
