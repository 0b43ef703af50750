"""``dynamoctl pools`` against a real dynamod: apply (and its dry run), ls, get, status,
pause, resume, rm in every output format, refusals as one line with exit 1, and pool
events in ``events tail``. Workers are records with pinned ids, so the dry run's moves are
golden."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli.conftest import Cli, Cluster, golden, record, register_records, start_cluster

pytestmark = pytest.mark.timeout(240)

IDS = ("0a000000000000a1", "0a000000000000a2", "0a000000000000a3", "0a000000000000a4")
POLICY = """\
name: split
selector: model=pooled
pools:
  pool=fast: 1
  pool=slow: 3
"""


@pytest.fixture(scope="module")
def pooled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A daemon of this module's own (its leader writes taints) and four pinned records."""
    cluster = start_cluster(tmp_path_factory.mktemp("pools"))
    try:
        register_records(cluster.store_url, [record(i, model="pooled") for i in IDS])
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("policy") / "split.yaml"
    path.write_text(POLICY)
    return path


def until_status(cli: Cli, accept: Any, within: float = 30.0) -> dict[str, Any]:
    """``pools status split -o json`` once ``accept`` takes it."""
    deadline = time.monotonic() + within
    while True:
        status: dict[str, Any] = json.loads(cli.ok("pools", "status", "split", "-o", "json").out)
        if accept(status):
            return status
        assert time.monotonic() < deadline, f"status never accepted: {status}"
        time.sleep(0.2)


def test_a_dry_run_prints_each_move_and_stores_nothing(pooled: Cluster, policy_file: Path) -> None:
    cli = pooled.cli
    shown = cli.ok("pools", "apply", "-f", str(policy_file), "--dry-run").out
    golden("pools-apply-dry-run.txt", shown)
    obj = json.loads(
        cli.ok("pools", "apply", "-f", str(policy_file), "--dry-run", "-o", "json").out
    )
    assert obj["outcome"] == "created" and obj["dry_run"] is True and obj["revision"] == 0
    assert [m["worker"] for m in obj["moves"]] == list(IDS)
    assert {m["from"] for m in obj["moves"]} == {None}
    assert {m["why"] for m in obj["moves"]} == {"joined"}
    assert cli.ok("pools", "ls", "-o", "json").out.strip() == "[]"


def test_apply_then_every_view_of_the_policy(pooled: Cluster, policy_file: Path) -> None:
    cli = pooled.cli
    first = cli.ok("pools", "apply", "-f", str(policy_file)).out
    assert first.startswith("policy split created (revision ")
    repeat = json.loads(cli.ok("pools", "apply", "-f", str(policy_file), "-o", "json").out)
    assert repeat["outcome"] == "unchanged"

    table = cli.ok("pools", "ls").lines
    assert table[0].split() == ["NAME", "SELECTOR", "POOLS", "PAUSED", "REVISION"]
    assert table[1].split()[:4] == ["split", "model=pooled", "pool=fast:1,pool=slow:3", "no"]
    wide = cli.ok("pools", "ls", "-o", "wide").lines
    assert wide[0].split()[-2:] == ["OPTIONS", "RETIRED"]
    [listed] = json.loads(cli.ok("pools", "ls", "-o", "json").out)
    assert listed["pools"] == {"pool=fast": 1, "pool=slow": 3} and listed["retired"] == []
    assert yaml.safe_load(cli.ok("pools", "ls", "-o", "yaml").out) == [listed]
    assert cli.ok("pools", "ls", "-o", "name").out == "split\n"
    got = yaml.safe_load(cli.ok("pools", "get", "split", "-o", "yaml").out)
    assert got == listed and got["policy"]["selector"] == "model=pooled"
    details = cli.ok("pools", "get", "split").out
    assert "Pools:     pool=fast:1,pool=slow:3" in details

    status = until_status(cli, lambda s: s["balanced"] and len(s["recent"]) == 4)
    assert [(p["pool"], p["target"], p["actual"]) for p in status["pools"]] == [
        ("pool=fast", 1, 1), ("pool=slow", 3, 3),
    ]  # fmt: skip
    assert status["leading"] and status["leader"] and status["epoch"] > 0
    assert {m["epoch"] for m in status["recent"]} == {status["epoch"]}
    assert status["conflict"] is None and status["drift"] == []
    text = cli.ok("pools", "status", "split").out
    assert "Balanced:  yes" in text and "Recent moves:" in text and "Drift: none" in text
    assert "Pending moves: none" in text


def test_pause_resume_and_remove_say_what_they_did(pooled: Cluster, policy_file: Path) -> None:
    cli = pooled.cli
    cli.ok("pools", "apply", "-f", str(policy_file))
    assert cli.ok("pools", "pause", "split").out == "policy split paused\n"
    assert cli.ok("pools", "pause", "split").out == "policy split already paused\n"
    paused = json.loads(cli.ok("pools", "get", "split", "-o", "json").out)
    assert paused["paused"] is True
    resumed = json.loads(cli.ok("pools", "resume", "split", "-o", "json").out)
    assert resumed["paused"] is False and resumed["changed"] is True
    until_status(cli, lambda s: s["balanced"])
    removed = cli.ok("pools", "rm", "split").out
    assert removed == (
        "policy split removed; its pool taints stay as they are on 4 workers (removing a "
        "policy changes no taint)\n"
    )
    listing = json.loads(cli.ok("workers", "ls", "-l", "model=pooled", "-o", "json").out)
    assert sorted(t for w in listing for t in w["taints"]) == ["pool=fast"] + ["pool=slow"] * 3


def test_refusals_are_one_line_and_exit_one(pooled: Cluster, tmp_path: Path) -> None:
    cli = pooled.cli
    bad = tmp_path / "bad.yaml"
    bad.write_text(POLICY.replace("pool=slow: 3", "pool=slow: 0"))
    refused = cli.run("pools", "apply", "-f", str(bad))
    assert refused.code == 1
    assert refused.err == (
        "dynamoctl: error: pools: weight of 'pool=slow' must be a positive number, got 0\n"
    )
    missing = cli.run("pools", "status", "nope")
    assert missing.code == 1
    assert "no pool policy named 'nope'" in missing.err
    unreadable = cli.run("pools", "apply", "-f", str(tmp_path / "absent.yaml"))
    assert unreadable.code == 2 and "cannot read policy file" in unreadable.err


def test_events_tail_shows_pool_events_unless_told_not_to(
    pooled: Cluster, policy_file: Path
) -> None:
    cli = pooled.cli
    cli.ok("pools", "apply", "-f", str(policy_file))
    until_status(cli, lambda s: s["balanced"])
    lines = cli.ok("events", "tail", "--since", "0", "--no-follow", "-o", "json").lines
    pools = [json.loads(line)["pool"] for line in lines if '"event":"POOL"' in line]
    kinds = {p["kind"] for p in pools}
    assert {"APPLIED", "MOVED", "LEADER"} <= kinds
    moved = [p for p in pools if p["kind"] == "MOVED"]
    assert all(p["epoch"] and p["leader"] and p["to"] for p in moved)
    table = cli.ok("events", "tail", "--since", "0", "--no-follow").out
    assert "POOL" in table and "MOVED split: worker" in table
    plain = cli.ok("events", "tail", "--since", "0", "--no-follow", "--no-pools", "-o", "json")
    assert '"POOL"' not in plain.out


def test_removing_a_pool_taint_by_hand_says_the_policy_puts_it_back(
    pooled: Cluster, policy_file: Path
) -> None:
    """``taints rm W pool=fast`` succeeds, and the leader puts the taint back within
    moments: the answer says so, and how to keep it off. A paused policy puts nothing back,
    and nothing is said."""
    cli = pooled.cli
    cli.ok("pools", "apply", "-f", str(policy_file))
    cli.run("pools", "resume", "split")
    until_status(cli, lambda s: s["balanced"])
    fast = cli.ok("workers", "ls", "-l", "pool=fast", "-o", "name").lines[0]
    removed = cli.ok("taints", "rm", fast, "pool=fast")
    assert removed.err == (
        f"dynamoctl: policy split owns pool=fast on worker {fast} and will put it back; to "
        "keep it off, pause the policy first: dynamoctl pools pause split\n"
    )
    until_status(cli, lambda s: s["balanced"])
    cli.ok("pools", "pause", "split")
    slow = cli.ok("workers", "ls", "-l", "pool=slow", "-o", "name").lines[0]
    assert cli.ok("taints", "rm", slow, "pool=slow").err == ""
    cli.ok("pools", "resume", "split")
    until_status(cli, lambda s: s["balanced"])
