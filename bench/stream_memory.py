"""What one followed engine stream costs in memory, in one process: the daemon's reader
(``boundary/events_stream.events`` on ``http/stream_get.py``) against the same lines read
through aiohttp's client (what the daemon used before), on ``bench.stream_server``.

    python -m bench.stream_memory [--streams 300]     # DYNAMO_EVENT_LOOP=asyncio: not uvloop

For each reader, in a process of its own: one stream opened first (imports and one-off
caches out of the count), then ``--streams`` more, each followed until its snapshot and a
few heartbeats. Reported: Python objects per stream (``tracemalloc``: what was allocated
and is still held) and RSS per stream (``psutil``), both as the difference from before the
streams opened, and the lines that hold the most.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import subprocess
import sys
import tracemalloc
from collections.abc import AsyncIterator, Callable, Sequence

import aiohttp
import psutil

from dynamod.boundary.budgets import Budgets, RateBudget
from dynamod.boundary.events_stream import events
from dynamod.http.bounded import LineReader
from dynamod.lifecycle import LOOP_ENV, server_loop
from tests.support.processes import Proc, running

READERS = ("stream_get", "aiohttp")
HELD = 5.0
"""Seconds every stream stays open before the count: two heartbeats or more each."""


async def ours(url: str, budgets: Budgets) -> AsyncIterator[None]:
    async with contextlib.aclosing(events(url, budgets, RateBudget(budgets))) as stream:
        async for _ in stream:
            yield None


def aiohttp_reader(session: aiohttp.ClientSession) -> Callable[[str, Budgets], AsyncIterator[None]]:
    async def follow(url: str, budgets: Budgets) -> AsyncIterator[None]:
        async with session.get(url, raise_for_status=True) as response:
            lines = LineReader(response.content, budgets.line, url)
            while True:
                async with asyncio.timeout(budgets.stall):
                    if await lines.next_line() is None:
                        return
                yield None

    return follow


async def measure(
    base: str, streams: int, follow: Callable[[str, Budgets], AsyncIterator[None]]
) -> tuple[float, float, list[str]]:
    """KB of Python objects and of RSS per stream, and the top lines by what they hold."""
    budgets, opened = Budgets(), asyncio.Semaphore(0)

    async def one(i: int) -> None:
        first = True
        async for _ in follow(f"{base}/w{i}/engine/events", budgets):
            if first:
                first = False
                opened.release()

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(one(0))]
        await opened.acquire()
        gc.collect()
        tracemalloc.start()
        traced, rss = tracemalloc.get_traced_memory()[0], psutil.Process().memory_info().rss
        tasks += [group.create_task(one(i)) for i in range(1, streams + 1)]
        for _ in range(streams):
            await opened.acquire()
        await asyncio.sleep(HELD)
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - traced
        rss = psutil.Process().memory_info().rss - rss
        top = [str(s) for s in tracemalloc.take_snapshot().statistics("lineno")[:6]]
        tracemalloc.stop()
        for task in tasks:
            task.cancel()
    return traced / streams / 1024, rss / streams / 1024, top


async def run(args: argparse.Namespace) -> None:
    server = Proc([sys.executable, "-m", "bench.stream_server"], r"^stream server ready:")
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with (
        running(server),
        aiohttp.ClientSession(connector=connector, auto_decompress=False, timeout=timeout) as http,
    ):
        follow = ours if args.reader == "stream_get" else aiohttp_reader(http)
        objects, rss, top = await measure(server.field("http"), args.streams, follow)
        loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
        print(f"{args.reader:10} loop={loop} streams={args.streams}: "
              f"{objects:.1f} KB of Python objects, {rss:.1f} KB RSS a stream")  # fmt: skip
        for line in top:
            print(f"    {line}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stream_memory", description=__doc__)
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--reader", choices=READERS, help="one reader, in this process")
    args = parser.parse_args(argv)
    if args.reader is None:  # each in a process of its own: RSS freed by one hides the other
        print(f"# the daemon's loop (${LOOP_ENV}={os.environ.get(LOOP_ENV, '')!r})", flush=True)
        for reader in READERS:
            again = [sys.executable, "-m", "bench.stream_memory", "--reader", reader]
            subprocess.run([*again, "--streams", str(args.streams)], check=True)
        return 0
    with asyncio.Runner(loop_factory=server_loop) as runner:
        runner.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
