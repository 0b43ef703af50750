"""The peer benchmark's own machinery, without Dynamo: its arithmetic (ratios, floors,
per-round spread), its report section splicing, its refusals, and that stopping a foreign
process takes its whole process group with it."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from bench.peer import run as peer
from bench.peer import venv as peer_venv
from bench.peer.measure import Load, TaintSample
from bench.peer.procs import Detached, detached
from bench.peer.rows import Raw, rows_of
from bench.peer.stacks import system_port
from bench.report import kept_section, splice
from tests.support.eventually import eventually

MS = 1_000_000


def load(requests: int, seconds: float, front: float = 0.0) -> Load:
    return Load(ns=[MS] * requests, seconds=seconds, cpu_s={"front": front, "worker": 0.1})


def taints(routed_ms: int, attempts: int) -> list[TaintSample]:
    return [TaintSample(3 * MS, routed_ms * MS, attempts, MS)]


def synthetic() -> Raw:
    """Two rounds where dynamod is twice as slow as Dynamo in the first and as fast in the
    second; workers (the floors) at 1 ms and 3 ms."""
    raw = Raw()
    for measure in ("seq", "first_new", "first_kept"):
        raw.add(measure, "dynamod", [4 * MS] * 10)
        raw.add(measure, "dynamod", [2 * MS] * 10)
        raw.add(measure, "dynamo", [2 * MS] * 10)
        raw.add(measure, "dynamo", [2 * MS] * 10)
        for _ in range(2):
            raw.add(measure, "dynamod-worker", [1 * MS] * 10)
            raw.add(measure, "dynamo-worker", [3 * MS] * 10)
    raw.loads = {
        "dynamod": [load(100, 1.0, front=0.05), load(300, 1.0, front=0.15)],
        "dynamo": [load(200, 1.0, front=0.2), load(200, 1.0, front=0.2)],
        "dynamod-worker": [load(500, 1.0)] * 2,
        "dynamo-worker": [load(250, 1.0)] * 2,
    }
    raw.taints = {"dynamod": [taints(2, 1), taints(2, 2)], "dynamo": [taints(4, 1)] * 2}
    raw.memory = {
        f: {"front_start_mib": m, "front_end_mib": m, "front_peak_mib": m, "worker_end_mib": m}
        for f, m in (("dynamod", 50.0), ("dynamo", 100.0))
    }
    return raw


def test_rows_give_pooled_ratios_per_round_spread_and_floors() -> None:
    rows = {r["measure"]: r for r in rows_of(synthetic())}
    seq = rows["sequential p50"]
    assert (seq["ours"], seq["dynamo"]) == (2.0, 2.0)  # nearest-rank p50 of the pooled rounds
    assert seq["rounds"] == [1.0, 2.0]
    assert (seq["floor_ours"], seq["floor_dynamo"]) == (1.0, 3.0)
    assert rows["sequential p99"]["ratio"] == 2.0
    assert rows["sequential p99"]["rounds"] is None
    put = rows["throughput"]
    assert (put["ours"], put["dynamo"], put["ratio"]) == (200.0, 200.0, 1.0)
    assert put["rounds"] == [0.5, 1.5]
    assert (put["floor_ours"], put["floor_dynamo"]) == (500.0, 250.0)
    assert rows["front CPU per request"]["ours"] == pytest.approx(500.0)  # 0.2 s / 400
    assert rows["front CPU per request"]["dynamo"] == pytest.approx(1000.0)
    assert rows["taint POST returned → routed p50"]["ratio"] == 0.5
    assert rows["routed at the first request"]["ours"] == 50.0
    assert rows["routed at the first request"]["ratio"] is None
    assert rows["front RSS after load"]["ratio"] == 0.5


def test_the_peer_section_is_replaced_in_place_or_added_once() -> None:
    text = "# Results\n\n## A\n\na\n\n## Peer\n\nold\n\n## B\n\nb\n"
    replaced = splice(text, "Peer", ["new", ""])
    assert replaced == "# Results\n\n## A\n\na\n\n## Peer\n\nnew\n\n## B\n\nb\n"
    assert kept_section(replaced, "Peer") == ["new", ""]
    added = splice("# Results\n\n## A\n\na\n", "Peer", ["new"])
    assert added == "# Results\n\n## A\n\na\n\n## Peer\n\nnew\n"
    assert splice(added, "Peer", ["newer"]).count("## Peer") == 1
    assert kept_section("# Results\n", "Peer") is None


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--rounds", "0"], "--rounds 0 must be at least 1"),
        (["--rounds", "4", "--updates", "3"], "--updates 3 must be at least --rounds 4"),
        (["--seconds", "0"], "--seconds 0 must be more than 0"),
    ],
)
def test_bad_sizes_are_refused_with_the_rule(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        peer.parse(argv)
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


def test_a_venv_is_reused_only_if_this_benchmark_built_it(tmp_path: Path) -> None:
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    with pytest.raises(RuntimeError, match=r"has no dynamod-bench\.json"):
        peer_venv.ensure(stranger)
    other = tmp_path / "other"
    other.mkdir()
    (other / peer_venv.STAMP).write_text(json.dumps({"requirements": ["ai-dynamo==0.1"]}))
    with pytest.raises(RuntimeError, match="other requirements"):
        peer_venv.ensure(other)
    ours = tmp_path / "ours"
    ours.mkdir()
    stamp = {"requirements": list(peer_venv._wanted()), "packages": {}}
    (ours / peer_venv.STAMP).write_text(json.dumps(stamp))
    assert peer_venv.ensure(ours) == stamp


def test_a_system_port_fits_a_signed_16_bit_number() -> None:
    assert 20000 <= system_port() <= 32767


async def dead(pid: int, within: float = 5.0) -> bool:
    """Whether ``pid`` is gone (a zombie counts) within ``within`` s. It is not our child,
    so there is nothing to wait on but its state."""

    async def gone() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    return await eventually(gone, within=within, every=0.01, what=f"pid {pid} gone")


async def test_stopping_a_detached_process_kills_its_whole_group(tmp_path: Path) -> None:
    """A child that ignores SIGTERM, and a grandchild it started, are both killed."""
    script = (
        "import signal, subprocess, sys\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "sys.stdin.readline(); print(child.pid, flush=True); child.wait()\n"
    )
    argv = [sys.executable, "-c", script]
    proc = Detached("stubborn", argv, os.environ, tmp_path / "log", talk=True)
    async with detached(proc):
        grandchild = int(await proc.ask("who"))
        assert os.getpgid(grandchild) == proc.pid  # its own session: one group
        assert await proc.stop(grace=0.2) == -signal.SIGKILL
    assert await dead(grandchild)


async def test_a_helpers_answer_may_be_far_longer_than_asyncios_line_limit(
    tmp_path: Path,
) -> None:
    """A closed-loop measure answers with every latency sample on one line: megabytes."""
    echo = "import sys\nfor line in sys.stdin:\n    print('x' * 2_000_000, flush=True)\n"
    proc = Detached("talker", [sys.executable, "-c", echo], os.environ, tmp_path / "log", talk=True)
    async with detached(proc):
        answer = await proc.ask("go")
    assert len(answer) == 2_000_001
