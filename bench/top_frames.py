"""What ``dynamoctl top`` costs the daemon: a frame of the stats stream, and the front's
count of each answer.

    python -m bench.top_frames [--workers 1000 10000] [--frames 20]

For each fleet size, in one process (a memory store, the daemon's ``WorkerView``,
``Router`` and ``StatsSampler``; no gRPC): the time to build one frame of 40 rows sorted
by load, by id, and with a selector matching half the fleet, against the floor of one
pass over the view's records (what any frame must at least read). Then the front's side:
``Traffic.answered`` per answer, against a dictionary look-up and an increment (the least
a per-worker count can cost), and the frame's size on the wire.

NVIDIA Dynamo has no live fleet view to compare with (its operators read the metrics its
frontend exports, `dynamo_frontend_*`); the floors are ours.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import time
from collections.abc import Callable

from bench.common import Stats, header, ms, overhead, render_table
from dynamod.api import stats_convert
from dynamod.discovery.registration import register
from dynamod.discovery.view import WorkerView
from dynamod.discovery_events import ViewResync
from dynamod.records import ModelCard, RuntimeConfig, WorkerRecord
from dynamod.router import Router
from dynamod.selectors import Selector, parse
from dynamod.stats_results import FleetStats, StatsQuery
from dynamod.stats_sampler import BASELINE, StatsSampler
from dynamod.store import open_store
from dynamod.tasks import cancel_and_wait
from dynamod.traffic import Traffic


def record(i: int) -> WorkerRecord:
    taints = ("half",) if i % 2 else ()
    return WorkerRecord(
        instance_id=f"{i:08x}{'0' * 8}", namespace="dynamo", component="backend",
        endpoint="generate", address=f"http://10.0.{i // 250 % 250}.{i % 250}:8000",
        model_card=ModelCard(name="llama"), runtime_config=RuntimeConfig(taints=taints),
    )  # fmt: skip


def timed(step: Callable[[], object], times: int) -> Stats:
    samples = []
    for _ in range(times):
        started = time.perf_counter_ns()
        step()
        samples.append(time.perf_counter_ns() - started)
    return Stats.of(samples)


async def fleet_of(size: int) -> tuple[StatsSampler, WorkerView]:
    store = await open_store("memory://")
    lease = await store.grant(3600)
    for i in range(size):
        await register(store, record(i), lease)
    view = WorkerView(store)
    router = Router()
    view.listen(router.apply)
    traffic = Traffic()
    view.listen(traffic.apply)
    task = asyncio.create_task(view.run())
    await view.ready.wait()
    await cancel_and_wait(task)
    await store.aclose()
    return StatsSampler(view, router, traffic), view


async def frames(size: int, times: int) -> list[list[str]]:
    sampler, view = await fleet_of(size)
    floor = timed(lambda: [(r.key, r.taints) for r in view.records()], times)
    rows = []
    with sampler.watch():
        for name, query in (
            ("by load", StatsQuery(limit=40)),
            ("by id", StatsQuery(sort="id", limit=40)),
            ("-l half", StatsQuery("half", limit=40)),
        ):
            selector = parse(query.selector)

            def build(query: StatsQuery = query, selector: Selector = selector) -> FleetStats:
                return sampler.frame(query, sampler.matching(selector), BASELINE)

            took = timed(build, times)
            frame = build()
            size_bytes = stats_convert.stats_to_pb(frame).ByteSize()
            rows.append([f"{size:,}", name, ms(took.p50_ms), ms(took.p99_ms),
                         ms(floor.p50_ms), overhead(took, floor), f"{size_bytes:,}"])  # fmt: skip
    return rows


def answers(calls: int) -> list[list[str]]:
    traffic = Traffic()
    keys = [record(i).key for i in range(100)]
    traffic.apply(ViewResync(tuple(record(i) for i in range(100)), 1))
    plain: dict[str, list[int]] = {key: [0] for key in keys}

    def ours() -> None:
        for i in range(calls):
            traffic.answered(keys[i % 100], 0.0123)

    def least() -> None:
        for i in range(calls):
            plain[keys[i % 100]][0] += 1

    took, floor = timed(ours, 20), timed(least, 20)
    each = [took.p50_ms * 1e6 / calls, floor.p50_ms * 1e6 / calls]
    return [["Traffic.answered", f"{each[0]:.0f}", f"{each[1]:.0f}", f"{each[0] - each[1]:+.0f}"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1_000, 10_000])
    parser.add_argument("--frames", type=int, default=20)
    args = parser.parse_args()
    print(header("top_frames", {"python": platform.python_version()}, "a stats frame"))
    rows = [row for size in args.workers for row in asyncio.run(frames(size, args.frames))]
    print(render_table(
        ["workers", "frame (40 rows)", "p50 ms", "p99 ms", "floor p50 ms", "over floor",
         "bytes"], rows,
    ))  # fmt: skip
    print()
    print(render_table(["per answer", "ns", "floor ns", "over floor"], answers(100_000)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
