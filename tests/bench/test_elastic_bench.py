"""``bench.elastic``: its arithmetic on made-up samples (what counts as within the SLO, as a
steady move, as a goal met), and ``--quick`` end to end with real processes (6 mocker
workers and a dynamod on etcd per arm), checked for the shape and sanity of what it prints
and saves, never for speed: a goal may be met or not on a loaded machine, but it must be
judged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.elastic import ARMS, FULL, Arm, Move, Sample, Setup, Sizes
from bench.elastic_report import BATCH, HEADERS, PREMIUM, goals, misses, summarize, within

ROOT = Path(__file__).resolve().parents[2]
SETUP = Setup(
    workers=6, max_num_seqs=2, speedup=0.1, max_tokens=10, slo_s=0.5, target_in_flight=2,
    scale_down_after=10, react_s=5, trace=FULL,
)  # fmt: skip


def sample(kind: str, sent: float, ttft: float | None, outcome: str = "200") -> Sample:
    return Sample(kind, sent, ttft, sent + 0.5, outcome, "w")


def test_a_failed_request_is_a_miss_and_the_slo_bound_is_inclusive() -> None:
    samples = [
        sample("premium", 1, 0.5),
        sample("premium", 2, 0.2),
        sample("premium", 3, 0.51),
        sample("premium", 4, None, "503"),
    ]
    assert within(samples, 0.5) == 0.5
    assert within([], 0.5) is None


def test_steady_windows_leave_out_the_time_a_policy_may_take_to_follow() -> None:
    """Each phase less ``react_s`` after a rise and ``scale_down_after`` + ``react_s``
    after the fall."""
    t = FULL
    assert SETUP.steady() == [
        (5, t.step_start),
        (t.step_start + 5, t.step_end),
        (t.step_end + 15, t.end),
    ]


def elastic_arm(moves_at: list[float], ttft_in_step: float) -> Arm:
    t = FULL
    samples = [sample("premium", t.step_start + i * 0.1, ttft_in_step) for i in range(100)]
    samples += [sample("premium", 1, 0.06), sample("batch", 2, 0.06)]
    sizes = [Sizes(t.step_start + 1, {PREMIUM: 4, BATCH: 2})]
    moves = [Move(at, "w", BATCH, PREMIUM, "demand") for at in moves_at]
    return Arm("elastic", samples, sizes, moves)


def test_a_move_is_steady_only_inside_a_window() -> None:
    t = FULL
    reactions = [t.step_start + 1, t.step_end + 11]  # a rise and a fall followed
    summary = summarize(elastic_arm(reactions, 0.2), SETUP)
    assert (summary.moves, summary.steady_moves) == (2, 0)
    flapping = summarize(elastic_arm([*reactions, t.step_start + 30], 0.2), SETUP)
    assert (flapping.moves, flapping.steady_moves) == (3, 1)
    assert summary.premium_workers == (4, 4)


def test_goals_are_judged_on_the_figures() -> None:
    static = summarize(Arm("static", elastic_arm([], 0.9).samples, [], []), SETUP)
    good = summarize(elastic_arm([FULL.step_start + 1], 0.2), SETUP)
    met = goals([static, good])
    assert [g.met for g in met] == [True, True, True], [g.line() for g in met]
    slow = summarize(elastic_arm([FULL.step_start + 30], 0.6), SETUP)
    missed = goals([static, slow])
    assert [g.met for g in missed] == [False, True, False], [g.line() for g in missed]
    alone = goals([static])
    assert [g.met for g in alone] == [None, None, None]


def test_the_misses_are_placed_before_or_after_the_first_move_of_the_step() -> None:
    t = FULL
    arm = elastic_arm([t.step_start + 1, t.step_end + 11], 0.2)
    for sent, ttft in ((0.5, 0.7), (0.6, None), (9, 0.8), (t.step_s + 1, 0.9)):
        arm.samples.append(sample("premium", t.step_start + sent, ttft))
    said = misses(arm, SETUP)
    assert said == (
        "elastic: 3 of 103 step requests missed the SLO, 2 of them sent before the first move "
        "(1.0 s into the step)"
    )
    assert misses(Arm("static", arm.samples, [], []), SETUP).endswith("missed the SLO; no move")


@pytest.mark.etcd
@pytest.mark.timeout(600)
def test_the_quick_run_measures_every_arm_start_to_end(tmp_path: Path) -> None:
    out = tmp_path / "elastic.json"
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Other\n\nkept\n")
    argv = [sys.executable, "-m", "bench.elastic", "--quick", "--json", str(out),
            "--results", str(results)]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=580)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads(out.read_text())
    assert [a["name"] for a in document["arms"]] == list(ARMS)
    for arm, summary in zip(document["arms"], document["summaries"], strict=True):
        name = arm["name"]
        assert not arm["refused"], arm["refused"]
        kinds = {s["kind"] for s in arm["samples"]}
        assert kinds == {"premium", "batch"}, (name, kinds)
        assert summary["step_n"] > 0 and summary["all_n"] >= summary["step_n"], summary
        for share in (summary["step_within"], summary["all_within"]):
            assert 0 <= share <= 1, summary
        ttft = summary["all_ttft"]
        assert 0 < ttft["min_ms"] <= ttft["p50_ms"] <= ttft["p99_ms"] <= ttft["max_ms"]
        assert summary["batch_per_s"] > 0, summary
        if name == "no-pools":
            assert arm["sizes"] == [] and summary["moves"] is None, summary
        else:
            assert arm["sizes"], f"{name}: the pools were never sampled"
            totals = {sum(z["pools"].values()) for z in arm["sizes"]}
            assert totals == {6}, f"{name}: pools of {totals} workers (a move is one write)"
            assert 0 <= summary["steady_moves"] <= summary["moves"], summary
    static = document["summaries"][0]
    assert static["moves"] == 0 and static["premium_workers"] == [2, 2], static
    assert [g["met"] in (True, False) for g in document["goals"]] == [True] * 3
    lines = done.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("arm "))
    assert all(h in lines[head] for h in HEADERS)
    assert [line.split()[0] for line in lines[head + 2 : head + 2 + len(ARMS)]] == list(ARMS)
    assert sum(line.startswith("goal: ") for line in lines) == 3
    written = results.read_text()
    assert "## Other\n\nkept\n" in written and "## Elastic pools" in written
    assert (tmp_path / "plots" / "elastic.png").stat().st_size > 0
