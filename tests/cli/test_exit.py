"""Exit cleanliness: ``dynamoctl events tail`` interrupted mid-stream, hundreds of times,
while taints keep changing. Every run must end with 0 and an empty stderr: no traceback,
no "Exception ignored", no "Task was destroyed". ``DYNAMO_CLI_EXIT_RUNS`` lowers the
count for a quick local run (default 300)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from dynamod.client import AsyncClient
from dynamod.taints import TaintUpdate
from dynamod.targets import Target
from tests.cli.conftest import Cluster
from tests.support.processes import BAD_STDERR, Lines, dynamoctl

pytestmark = pytest.mark.timeout(900)

RUNS = int(os.environ.get("DYNAMO_CLI_EXIT_RUNS", "300"))
AT_ONCE = 4  # runs in flight together: signals land while others start, stream and exit
VARIANTS = (["events", "tail"], ["events", "tail", "-o", "json"], ["workers", "ls", "--watch"])


@dataclass(frozen=True)
class Run:
    args: tuple[str, ...]
    code: int
    err: str


class Churn:
    """Changes a worker's taints over and over in a thread of its own, so the streams under
    test are busy when the signal lands."""

    def __init__(self, endpoint: str, worker: str) -> None:
        self.endpoint = endpoint
        self.worker = worker
        self.stopping = threading.Event()
        self.changes = 0
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="churn")

    async def _run(self) -> None:
        async with AsyncClient(self.endpoint) as client:
            while not self.stopping.is_set():
                churn = ["churn/on"]
                update = (
                    TaintUpdate.add(churn) if self.changes % 2 == 0 else TaintUpdate.remove(churn)
                )
                await client.update_taints(update, Target(worker=self.worker))
                self.changes += 1
                await asyncio.sleep(0.02)  # pacing, not polling: one change per 20 ms

    def __enter__(self) -> Churn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=30)


@pytest.fixture
def churn(cluster: Cluster) -> Iterator[Churn]:
    (worker,) = cluster.start_workers(("churn", []))
    cluster.seen([worker.field("id")])
    with Churn(cluster.cli.endpoint, worker.field("id")) as running:
        yield running


def interrupted(cluster: Cluster, index: int) -> Run:
    """One run: start a stream, read into it, wait a random moment, then Ctrl-C."""
    args = VARIANTS[index % len(VARIANTS)]
    proc = subprocess.Popen(
        dynamoctl(*args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=cluster.cli.env(),
    )
    assert proc.stdout is not None
    lines = Lines(proc.stdout.fileno(), args)
    for _ in range(1 if "json" in args else 2):  # json: an event; tables: header and a row
        lines.next(60)
    time.sleep(random.Random(index).uniform(0, 0.1))  # land the signal at varied moments
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    return Run(tuple(args), proc.returncode, err.decode(errors="replace"))


def test_ctrl_c_mid_stream_exits_0_and_says_nothing(cluster: Cluster, churn: Churn) -> None:
    with ThreadPoolExecutor(AT_ONCE) as pool:
        runs = list(pool.map(lambda i: interrupted(cluster, i), range(RUNS)))
    failed = [r for r in runs if r.code != 0]
    dirty = [r for r in runs if any(bad in r.err for bad in BAD_STDERR)]
    noisy = [r for r in runs if r.err]
    print(
        f"\n{RUNS} interrupted streams while {churn.changes} taint changes ran: "
        f"{len(failed)} non-zero exits, {len(dirty)} with tracebacks or warnings, "
        f"{len(noisy)} with anything on stderr"
    )
    assert not failed, failed[:3]
    assert not noisy, noisy[:3]
    assert churn.changes > 0


def test_a_reader_closing_the_pipe_mid_stream_ends_it_cleanly(
    cluster: Cluster, churn: Churn
) -> None:
    """``dynamoctl events tail | head``: 141, as for SIGPIPE, and nothing on stderr."""
    for index in range(max(3, RUNS // 20)):
        read, write = os.pipe()
        proc = subprocess.Popen(
            dynamoctl(*VARIANTS[index % 2]), stdout=write, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL, env=cluster.cli.env(),
        )  # fmt: skip
        os.close(write)
        Lines(read, "tail").next(60)
        time.sleep(random.Random(index).uniform(0, 0.05))
        os.close(read)
        _, err = proc.communicate(timeout=60)
        assert (proc.returncode, err) == (141, b"")
