"""A drain whose worker is SIGKILLed mid-stream (issue 28), with real processes: a
``dynamod`` on a file store, slowed mocker workers, a stream through the front and
``dynamoctl workers drain`` as an operator runs it. The drain reports the worker gone,
with what was in flight, and exits 1; with ``--allow-gone`` it exits 0."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import Cluster, assert_clean, start_cluster
from tests.drain.test_drain_processes import SLOW, WITHIN, LongStream, until, worker_of
from tests.support.processes import dynamoctl

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    started = start_cluster(tmp_path / "gone")
    try:
        started.start_workers(("llama", SLOW), ("llama", SLOW))
        started.seen([w.field("id") for w in started.workers])
        yield started
    finally:
        started.stop()


def busy(seen: dict[str, Any]) -> bool:
    return bool(seen["state"] == "draining" and (seen["engine"] or {}).get("running") == 1)


def drain_killed(cluster: Cluster, *flags: str) -> subprocess.CompletedProcess[str]:
    """Drain the worker of a stream in flight, SIGKILL it once the drain sees the stream
    on the engine too, and the drain command's outcome."""
    cli = cluster.cli
    stream = LongStream(cluster.daemon.field("http"))
    worker = stream.worker
    command = subprocess.Popen(
        dynamoctl("workers", "drain", worker, *flags),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env=cli.env(),
    )  # fmt: skip
    try:
        until(cli, worker, busy)
        assert command.poll() is None
        worker_of(cluster, worker).stop(signal.SIGKILL)
        out, err = command.communicate(timeout=WITHIN)
    finally:
        stream.end()
        if command.poll() is None:
            command.kill()
            command.communicate()
    return subprocess.CompletedProcess(command.args, command.returncode, out, err)


def test_a_drain_whose_worker_is_killed_reports_it_gone_and_fails(cluster: Cluster) -> None:
    result = drain_killed(cluster)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "gone mid-drain (killed or left) with router" in result.stdout
    assert "engine running 1" in result.stdout
    assert "1 of 1 worker was gone mid-drain" in result.stderr
    assert "drained" not in result.stdout.split()


def test_allow_gone_accepts_a_killed_worker(cluster: Cluster) -> None:
    result = drain_killed(cluster, "--allow-gone")
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "gone mid-drain" in result.stdout
    assert_clean(cluster.daemon.log, "dynamod's stderr")
