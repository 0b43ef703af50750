"""The stats stream (``StatsService.WatchStats``, ``AsyncClient.watch_stats``) of an
in-process dynamod on real sockets: frames, their order and selection, the per-worker
answers the front counts, bad queries, and a 10,000-worker fleet whose frames carry only
the rows asked for."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from dynamod.client import AsyncClient
from dynamod.daemon import Daemon
from dynamod.discovery.registration import Registration, new_instance_id, register
from dynamod.errors import InvalidInputError, SelectorError
from dynamod.records import WorkerRecord
from dynamod.results import WorkerState
from dynamod.stats_results import FleetStats, StatsQuery
from dynamod.store import Store, open_store
from dynamod.traffic import BOUNDS, FirstBytes, Traffic, quantile
from dynamod.worker.engines.mocker import MockerConfig, MockerEngine
from dynamod.worker.inference import InferenceRoutes
from tests.daemon.helpers import client_for, running_daemon, settings_for
from tests.support.factories import make_record
from tests.support.web import served


@contextlib.asynccontextmanager
async def fleet(tmp_path: Path) -> AsyncIterator[tuple[Store, Daemon, AsyncClient]]:
    async with (
        await open_store("memory://") as store,
        running_daemon(store, settings_for(store, tmp_path)) as daemon,
        client_for(settings_for(store, tmp_path)) as client,
    ):
        yield store, daemon, client


async def frame_where(
    client: AsyncClient,
    query: StatsQuery,
    holds: Callable[[FleetStats], object],
    within: float = 30,
) -> FleetStats:
    """The first frame of a watch that ``holds`` takes (frames come once a second)."""
    async with asyncio.timeout(within):
        async for frame in client.watch_stats(query):
            if holds(frame):
                return frame
    raise AssertionError("the stream ended")


@contextlib.asynccontextmanager
async def mocker(store: Store, *taints: str) -> AsyncIterator[WorkerRecord]:
    """An in-process worker: the mocker engine behind the real inference routes."""
    instance_id = new_instance_id()
    async with MockerEngine(MockerConfig(model_name="llama", speedup_ratio=100.0)) as engine:
        app = web.Application()
        InferenceRoutes(engine, instance_id).add_to(app)
        async with served(app) as url:
            record = make_record(instance_id=instance_id, address=url, taints=taints)
            async with Registration(store, record, ttl=30):
                yield record


async def test_a_frame_counts_states_and_sorts_and_cuts_rows(tmp_path: Path) -> None:
    """Five workers, one cordoned: the header counts them by state; a query sorted by id
    with a limit and an offset gets exactly those rows, the selector only its workers."""
    async with fleet(tmp_path) as (store, _, client):
        lease = await store.grant(60)
        for i in range(5):
            taints = ("dynamo.io/cordoned",) if i == 1 else ("tier=a",) if i < 3 else ()
            await register(store, make_record(instance_id=f"w{i}-{'0' * 12}", taints=taints), lease)
        frame = await frame_where(client, StatsQuery(sort="id", limit=2, offset=1),
                                  lambda f: f.workers == 5)  # fmt: skip
        assert frame.matched == 5
        assert frame.states == {WorkerState.READY: 4, WorkerState.CORDONED: 1}
        assert [r.id for r in frame.rows] == ["w1-000000000000", "w2-000000000000"]
        assert frame.offset == 1 and frame.replica == "test-replica"
        assert frame.rows[0].state is WorkerState.CORDONED
        picked = await frame_where(client, StatsQuery("tier=a", sort="id", reverse=True),
                                   lambda f: f.matched == 2)  # fmt: skip
        assert [r.id for r in picked.rows] == ["w2-000000000000", "w0-000000000000"]
        assert picked.states == {WorkerState.READY: 2} and picked.workers == 5


async def test_answers_are_counted_per_worker_and_in_all(tmp_path: Path) -> None:
    """Requests routed to one of two workers (by a required taint): its row has the
    answers per second and a first-byte p50, the other none; the header has them in all."""
    async with fleet(tmp_path) as (store, daemon, client), mocker(store, "hot") as hot, \
            mocker(store) as cold, aiohttp.ClientSession() as http:  # fmt: skip
        body = {"model": "llama", "prompt": "hello", "max_tokens": 2,
                "nvext": {"routing_constraints": {"required_taints": ["hot"]}}}  # fmt: skip

        async def ask(count: int) -> None:
            for _ in range(count):
                async with http.post(f"{daemon.http_url}/v1/completions", json=body) as answer:
                    assert answer.status == 200, await answer.text()

        async with asyncio.TaskGroup() as group:
            load = group.create_task(_forever(ask))
            frame = await frame_where(
                client, StatsQuery(sort="rps"), lambda f: f.interval and f.rps > 0 and
                f.rows[0].rps > 0 and f.rows[0].first_byte_p50 is not None,
            )  # fmt: skip
            load.cancel()
        rows = {r.id: r for r in frame.rows}
        assert frame.rows[0].id == hot.instance_id
        assert rows[cold.instance_id].rps == 0 and rows[cold.instance_id].first_byte_p50 is None
        assert frame.first_byte_p50 is not None and frame.first_byte_p99 is not None
        assert frame.first_byte_p50 <= frame.first_byte_p99


async def _forever(ask: Callable[[int], Awaitable[None]]) -> None:
    while True:
        await ask(5)


async def test_a_request_in_flight_is_in_the_next_frame(tmp_path: Path) -> None:
    """A streaming request held open by its worker: on a watch open before it came, the
    second frame after the worker got it (the first may have been on its way) shows it in
    flight there; a watch opened then shows it in its first frame. Frames come every
    second: within two seconds."""
    arrived, release = asyncio.Event(), asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[{"text":"a"}]}\n\n')
        arrived.set()
        await release.wait()
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/{api:.*}", slow)
    async with fleet(tmp_path) as (store, daemon, client), served(app) as url:
        record = make_record(address=url)
        async with Registration(store, record, ttl=30), aiohttp.ClientSession() as http:
            await frame_where(client, StatsQuery(), lambda f: f.workers == 1)
            watching = client.watch_stats(StatsQuery())
            assert (await anext(watching)).rows[0].in_flight == 0
            body = {"model": "llama", "prompt": "hello", "max_tokens": 50, "stream": True}
            async with asyncio.TaskGroup() as group:
                answer = group.create_task(_read(http, f"{daemon.http_url}/v1/completions", body))
                await arrived.wait()
                async with asyncio.timeout(30):
                    seen = [await anext(watching), await anext(watching)]
                    fresh = client.watch_stats(StatsQuery())
                    seen.append(await anext(fresh))
                await watching.aclose()
                await fresh.aclose()
                release.set()
                await answer
        for frame in seen[1:]:
            [row] = frame.rows
            assert row.id == record.instance_id and row.in_flight == 1


async def _read(http: aiohttp.ClientSession, url: str, body: dict[str, object]) -> bytes:
    async with http.post(url, json=body) as answer:
        assert answer.status == 200
        return await answer.read()


async def test_bad_queries_are_refused_with_the_rule(tmp_path: Path) -> None:
    """A sort, a limit or a selector the daemon does not take is INVALID_ARGUMENT naming
    the value and the rule; the client's own check says the same before sending."""
    async with fleet(tmp_path) as (_, _, client):
        with pytest.raises(InvalidInputError, match=r"sort 'hotness' is not one of load, id"):
            StatsQuery(sort="hotness")
        with pytest.raises(InvalidInputError, match=r"limit 10001 is out of range"):
            StatsQuery(limit=10_001)
        with pytest.raises(SelectorError):
            StatsQuery(selector="a,,b=")
        from dynamod.api.v1 import dynamo_pb2 as pb
        from dynamod.api.v1 import dynamo_pb2_grpc as rpc

        stub = rpc.StatsServiceStub(client._channel)
        call = stub.WatchStats(pb.WatchStatsRequest(sort="hotness", offset=-1))
        with pytest.raises(Exception, match=r"sort 'hotness' is not one of") as refused:
            async for _ in call:
                pass
        assert "INVALID_ARGUMENT" in repr(refused.value)


async def test_ten_thousand_workers_cost_the_rows_that_fit(tmp_path: Path) -> None:
    """At 10,000 workers a frame counts them all and carries the 40 rows asked for, in
    order; its message stays a few kilobytes, not the whole fleet. (The fleet is
    registered before the daemon starts: one snapshot, not 10,000 events.)"""
    async with await open_store("memory://") as store:
        lease = await store.grant(300)
        for i in range(10_000):
            taints = ("dynamo.io/cordoned",) if i % 100 == 0 else ()
            await register(
                store, make_record(instance_id=f"{i:06d}{'a' * 10}", taints=taints), lease
            )
        settings = settings_for(store, tmp_path)
        async with running_daemon(store, settings), client_for(settings) as client:
            frame = await frame_where(
                client, StatsQuery(sort="id", limit=40, offset=100), lambda f: f.workers == 10_000
            )
    assert frame.matched == 10_000 and len(frame.rows) == 40
    assert frame.states == {WorkerState.READY: 9_900, WorkerState.CORDONED: 100}
    assert [r.id[:6] for r in frame.rows] == [f"{i:06d}" for i in range(100, 140)]
    from dynamod.api import stats_convert

    assert stats_convert.stats_to_pb(frame).ByteSize() < 16_384
    assert frame.id_prefix == 8


async def test_the_stream_ends_when_the_daemon_drains(tmp_path: Path) -> None:
    async with await open_store("memory://") as store:
        settings = settings_for(store, tmp_path)
        async with client_for(settings) as client:
            frames = []
            async with running_daemon(store, settings) as daemon:
                async with asyncio.timeout(30):
                    async for frame in client.watch_stats():
                        frames.append(frame)
                        if len(frames) == 2:
                            daemon.stop()
            assert len(frames) >= 2


def test_first_bytes_are_counted_only_for_workers_in_the_view() -> None:
    from dynamod.discovery_events import WorkerAdded, WorkerRemoved

    traffic = Traffic()
    record = make_record()
    traffic.apply(WorkerAdded(record, 1))
    traffic.answered(record.key, 0.0105)
    traffic.answered("gone", 0.02)
    counts = traffic.get(record.key)
    assert counts is not None and counts.total == 1 and traffic.fleet.total == 2
    traffic.apply(WorkerRemoved(record, 2))
    assert traffic.get(record.key) is None and len(traffic) == 0


def test_quantiles_interpolate_inside_a_bucket() -> None:
    counts = FirstBytes().counts
    assert quantile(0.5, counts) is None
    counts[5] = 10  # ten answers between BOUNDS[4] and BOUNDS[5]
    middle = quantile(0.5, counts)
    assert middle is not None and BOUNDS[4] < middle < BOUNDS[5]
    counts[-1] = 1000  # slower than the last bound
    assert quantile(0.99, counts) == BOUNDS[-1]


async def test_the_blocking_client_iterates_frames(tmp_path: Path) -> None:
    """``Client.watch_stats``: frame by frame on the client's own thread; leaving the loop
    ends the stream."""
    from dynamod.client import Client, Credentials

    async with fleet(tmp_path) as (store, _, _):
        await register(store, make_record(), await store.grant(60))
        endpoint = settings_for(store, tmp_path).listen[0]

        def two() -> list[FleetStats]:
            with Client(endpoint, credentials=Credentials(), timeout=10) as client:
                frames: list[FleetStats] = []
                for frame in client.watch_stats(StatsQuery(limit=1)):
                    frames.append(frame)
                    if len(frames) == 2:
                        return frames
            raise AssertionError("the stream ended")

        _, second = await asyncio.to_thread(two)
    assert second.interval > 0 and len(second.rows) == 1 and second.workers == 1
