"""Changing taints with dynamoctl against a real dynamod and real mocker workers: every
verb, selectors and --all, --if-revision, --dry-run, cordon, access control over TCP, and
concurrent writers that never lose an update."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dynamod.client import AsyncClient
from dynamod.errors import TaintError
from dynamod.taints import TaintUpdate
from dynamod.targets import Target
from tests.cli.conftest import Cli, Cluster, on_terminal, start_cluster
from tests.support.processes import dynamoctl
from tests.support.servers import free_port

pytestmark = pytest.mark.timeout(240)

TOPOLOGY = "dynamo.topology/zone=a"  # the solo worker's generated taint

TOKENS = """
[[token]]
name = "admin"
secret = "admin-secret-1"
role = "write"

[[token]]
name = "viewer"
secret = "viewer-secret-1"
role = "read"

[[token]]
name = "scaler"
secret = "scaler-secret-1"
role = "write"
prefixes = ["capacity/"]
"""


class Fleet:
    """The module's cluster and its workers, by role."""

    def __init__(self, cluster: Cluster, tcp: str) -> None:
        self.cluster = cluster
        self.cli = cluster.cli
        self.tcp = tcp
        solo, a1, a2, b = cluster.start_workers(
            ("solo", ["--topology", "zone=a"]),
            ("bulk", ["--taint", "pool=a"]),
            ("bulk", ["--taint", "pool=a"]),
            ("bulk", ["--taint", "pool=b"]),
        )
        self.solo, self.a1, self.a2, self.b = (w.field("id") for w in (solo, a1, a2, b))
        cluster.seen([self.solo, self.a1, self.a2, self.b])

    def taints(self, *args: str) -> list[dict[str, Any]]:
        """Run a taints command with -o json; return its change objects."""
        changes: list[dict[str, Any]] = json.loads(self.cli.ok("taints", *args, "-o", "json").out)
        return changes

    def reset(self, worker: str, *taints: str) -> int:
        """Give ``worker`` exactly ``taints``; wait until dynamod's view has it; return the
        record's revision."""
        (change,) = self.taints("set", worker, *taints)
        self.cluster.settle(change["revision"])
        revision: int = change["revision"]
        return revision


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("taints")
    tokens = root / "tokens.toml"
    tokens.write_text(TOKENS)
    port = free_port()
    cluster = start_cluster(root, "--listen", f"127.0.0.1:{port}", "--tokens-file", str(tokens))
    try:
        yield Fleet(cluster, f"127.0.0.1:{port}")
    finally:
        cluster.stop()


def test_each_verb_says_what_changed_and_the_new_revision(fleet: Fleet) -> None:
    before = fleet.reset(fleet.solo)
    out = fleet.cli.ok("taints", "add", fleet.solo[:8], "capacity/fast", "pool=slow").lines
    assert out[0].split() == ["WORKER", "CHANGE", "REVISION"]
    worker, change, revision = out[1].split("   ")
    assert fleet.solo.startswith(worker.strip())
    assert change.strip() == "+capacity/fast +pool=slow"
    assert int(revision) > before

    (swap,) = fleet.taints("set", fleet.solo, "capacity/fast", "pool=fast")
    assert (swap["added"], swap["removed"]) == (["pool=fast"], ["pool=slow"])
    (gone,) = fleet.taints("rm", fleet.solo, "capacity/fast")
    assert gone["after"] == [TOPOLOGY, "pool=fast"] and gone["caller_after"] == ["pool=fast"]
    (by_key,) = fleet.taints("rm", fleet.solo, "--key", "pool")
    assert by_key["caller_after"] == [] and by_key["removed"] == ["pool=fast"]
    fleet.taints("add", fleet.solo, "a", "b")
    (cleared,) = fleet.taints("clear", fleet.solo)
    assert cleared["caller_after"] == [] and cleared["removed"] == ["a", "b"]


def test_topology_taints_are_shown_as_generated_and_never_cleared(fleet: Fleet) -> None:
    """After a clear the worker still holds what the router matches on: it says so."""
    fleet.reset(fleet.solo, "x")
    (cleared,) = fleet.taints("clear", fleet.solo)
    assert (cleared["before"], cleared["caller_before"]) == ([TOPOLOGY, "x"], ["x"])
    assert (cleared["after"], cleared["caller_after"]) == ([TOPOLOGY], [])
    shown = json.loads(fleet.cli.ok("workers", "get", fleet.solo, "-o", "json").out)
    assert shown["topology"] == {"zone": "a"}
    assert (shown["taints"], shown["caller_taints"], shown["generated_taints"]) == (
        [TOPOLOGY], [], [TOPOLOGY]
    )  # fmt: skip
    table = fleet.cli.ok("workers", "ls", "-l", f"id={fleet.solo}").lines
    assert table[1].split()[3] == TOPOLOGY


def test_unchanged_is_reported_and_writes_nothing(fleet: Fleet) -> None:
    revision = fleet.reset(fleet.solo, "keep")
    result = fleet.cli.ok("taints", "add", fleet.solo, "keep")
    assert result.lines[1].split()[1:] == ["unchanged", str(revision)]


def daemon_message(fleet: Fleet, taint: str) -> str:
    """What dynamod itself answers when asked to add ``taint`` (no CLI in between)."""

    async def ask() -> str:
        async with AsyncClient(fleet.cli.endpoint) as client:
            try:
                await client.update_taints(TaintUpdate.add([taint]), Target(worker=fleet.solo))
            except TaintError as exc:
                return str(exc)
        raise AssertionError(f"dynamod accepted {taint!r}")

    return asyncio.run(ask())


@pytest.mark.parametrize(
    "taint",
    [
        "dynamo.topology/zone=b",
        "Dynamo.Topology/zone=b",
        " padded",
        "tab\tinside",
        "k=" + "v" * 1023,
    ],
)
def test_bad_taints_are_refused_before_any_call_with_the_daemons_message(
    fleet: Fleet, taint: str, tmp_path: Path
) -> None:
    message = daemon_message(fleet, taint)
    nowhere = f"unix://{tmp_path / 'nobody-listens.sock'}"
    # Against an endpoint where nobody listens: a call would fail with 3, not 1.
    result = fleet.cli.run("taints", "add", fleet.solo, taint, env={"DYNAMO_ENDPOINT": nowhere})
    assert (result.code, result.out) == (1, "")
    assert result.err == f"dynamoctl: error: {message}\n"
    assert fleet.cli.run("taints", "add", fleet.solo, taint).err == result.err


def test_a_bad_key_or_selector_is_refused_before_any_call(fleet: Fleet, tmp_path: Path) -> None:
    nowhere = f"unix://{tmp_path / 'nobody-listens.sock'}"
    bad_key = fleet.cli.run(
        "taints", "rm", "x", "--key", "pool=a", env={"DYNAMO_ENDPOINT": nowhere}
    )
    assert bad_key.code == 1 and "must not contain '='" in bad_key.err
    bad_selector = fleet.cli.run(
        "taints", "add", "-l", "a,,b", "t", env={"DYNAMO_ENDPOINT": nowhere}
    )
    assert bad_selector.code == 1 and "has an empty term" in bad_selector.err


def test_an_unknown_worker_is_exit_1(fleet: Fleet) -> None:
    result = fleet.cli.run("taints", "add", "ffffffffffff", "x")
    assert result.code == 1
    assert result.err == "dynamoctl: error: no worker with id 'ffffffffffff'\n"


def test_if_revision_is_an_optimistic_lock(fleet: Fleet) -> None:
    revision = fleet.reset(fleet.solo, "v1")
    stale = fleet.cli.run("taints", "set", fleet.solo, "v2", "--if-revision", str(revision - 1))
    assert stale.code == 1
    assert f"is at revision {revision}, not the expected revision {revision - 1}" in stale.err
    (fresh,) = fleet.taints("set", fleet.solo, "v2", "--if-revision", str(revision))
    assert fresh["caller_after"] == ["v2"] and fresh["revision"] > revision


def test_if_revision_needs_a_single_worker(fleet: Fleet) -> None:
    result = fleet.cli.run("taints", "add", "-l", "pool=a", "x", "--if-revision", "3")
    assert result.code == 2
    assert "--if-revision needs a single worker ID" in result.err


def audit_lines(fleet: Fleet) -> int:
    return len((fleet.cluster.root / "audit.log").read_text().splitlines())


def test_dry_run_prints_before_and_after_and_writes_nothing(fleet: Fleet) -> None:
    revision = fleet.reset(fleet.solo, "old")
    written = audit_lines(fleet)
    out = fleet.cli.ok("taints", "set", fleet.solo, "new", "--dry-run")
    header, row = out.lines
    assert header.split() == ["WORKER", "CHANGE", "REVISION", "BEFORE", "AFTER"]
    before, after = f"{TOPOLOGY},old", f"{TOPOLOGY},new"
    assert row.split()[1:] == ["+new", "-old", str(revision), before, after]
    assert "dry run: nothing was written" in out.err
    fleet.cli.ok("taints", "add", "-l", "pool=a", "z", "--dry-run")
    fleet.cli.ok("taints", "clear", "--all", "--dry-run")  # no --yes needed: nothing changes
    shown = json.loads(fleet.cli.ok("workers", "get", fleet.solo, "-o", "json").out)
    assert (shown["caller_taints"], shown["revision"]) == (["old"], revision)
    assert audit_lines(fleet) == written


def test_a_selector_changes_every_matching_worker_and_only_those(fleet: Fleet) -> None:
    for worker, pool in ((fleet.a1, "pool=a"), (fleet.a2, "pool=a"), (fleet.b, "pool=b")):
        fleet.reset(worker, pool)
    changes = fleet.taints("add", "-l", "model=bulk,pool=a", "capacity/fast")
    assert sorted(c["id"] for c in changes) == sorted([fleet.a1, fleet.a2])
    assert all(c["added"] == ["capacity/fast"] and c["error"] is None for c in changes)
    untouched = json.loads(fleet.cli.ok("workers", "get", fleet.b, "-o", "json").out)
    assert untouched["taints"] == ["pool=b"]


def test_a_selector_matching_nothing_says_so_and_exits_1(fleet: Fleet) -> None:
    """A selector that matches nothing is usually a typo: a script must be able to tell."""
    result = fleet.cli.run("taints", "add", "-l", "model=nobody", "x")
    assert (result.code, result.out) == (1, "")
    assert "no worker matched: workers matching 'model=nobody'" in result.err


def test_all_asks_for_yes_when_nobody_can_be_asked(fleet: Fleet) -> None:
    refused = fleet.cli.run("taints", "add", "--all", "everyone")
    assert refused.code == 2
    assert "--all changes every worker and nobody can be asked" in refused.err
    changes = fleet.taints("add", "--all", "everyone", "--yes")
    assert len(changes) == 4 and all("everyone" in c["after"] for c in changes)
    for change in fleet.taints("rm", "--all", "everyone", "--yes"):
        assert "everyone" not in change["after"]


def test_all_on_a_terminal_asks_first(fleet: Fleet) -> None:
    code, shown = on_terminal(fleet.cli, "taints", "add", "--all", "asked", answer=b"n\n")
    assert code == 1
    assert "Change taints of 4 of all 4 workers (e.g. +asked)? [y/N]" in shown
    assert "nothing was changed" in shown
    code, shown = on_terminal(fleet.cli, "taints", "add", "--all", "asked", answer=b"y\n")
    assert code == 0 and shown.count("+asked") == 5  # the question's example, then 4 rows
    for change in fleet.taints("rm", "--all", "asked", "--yes"):
        assert change["removed"] == ["asked"]


def test_naming_no_workers_or_two_ways_is_a_usage_error(fleet: Fleet) -> None:
    for args in (["taints", "clear"], ["taints", "clear", fleet.solo, "--all"]):
        result = fleet.cli.run(*args)
        assert result.code == 2
        assert "name the workers with exactly one of ID, -l SELECTOR or --all" in result.err
    assert fleet.cli.run("taints", "add", fleet.solo).code == 2  # no taint


def test_cordon_takes_a_worker_out_of_routing_and_uncordon_puts_it_back(fleet: Fleet) -> None:
    fleet.reset(fleet.solo)
    assert fleet.cli.ok("workers", "cordon", fleet.solo).lines[1].split()[1] == "cordoned"
    again = fleet.cli.ok("workers", "cordon", fleet.solo).lines[1]
    assert "already cordoned" in again
    fleet.cluster.settle(int(again.split()[-1]))
    explained = fleet.cli.run("route", "explain", "--model", "solo", "-o", "json")
    assert explained.code == 1  # no worker is eligible: a script can tell
    assert "no worker of model 'solo' is eligible" in explained.err
    (candidate,) = json.loads(explained.out)["candidates"]
    assert not candidate["eligible"] and "cordoned" in candidate["reason"]
    assert "uncordoned" in fleet.cli.ok("workers", "uncordon", fleet.solo).out


def test_concurrent_writers_never_lose_an_update(fleet: Fleet) -> None:
    """kubectl taint runs clobber each other (kubernetes#31906); these cannot."""
    fleet.reset(fleet.solo)
    runs = [
        subprocess.Popen(
            dynamoctl("taints", "add", fleet.solo, f"writer-{i}"),
            env=fleet.cli.env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(6)
    ]
    errors = [r.communicate(timeout=60)[1] for r in runs]
    assert [r.returncode for r in runs] == [0] * 6, errors
    (now,) = fleet.taints("add", fleet.solo, "writer-0")
    assert now["caller_after"] == [f"writer-{i}" for i in range(6)]


def tcp(fleet: Fleet, token: str | None, tmp_path: Path) -> Cli:
    extra = {"DYNAMO_ENDPOINT": fleet.tcp}
    if token is not None:
        (tmp_path / "token").write_text(token + "\n")
        extra["DYNAMO_TOKEN_FILE"] = str(tmp_path / "token")
    return Cli(fleet.tcp, fleet.cli.home, extra)


def test_tokens_over_tcp(fleet: Fleet, tmp_path: Path) -> None:
    anonymous = tcp(fleet, None, tmp_path).run("workers", "ls")
    assert anonymous.code == 1 and "a bearer token is required on TCP" in anonymous.err
    viewer = tcp(fleet, "viewer-secret-1", tmp_path)
    assert len(viewer.ok("workers", "ls", "-o", "name").lines) == 4
    denied = viewer.run("taints", "add", fleet.solo, "capacity/x")
    assert denied.code == 1 and "'viewer' has read-only access" in denied.err


def test_a_bulk_change_where_some_workers_fail_prints_each_failure_and_exits_1(
    fleet: Fleet, tmp_path: Path
) -> None:
    """The scaler token may only touch capacity/ taints: replacing the taints of a worker
    that holds pool=a is refused, on a worker holding only capacity/ taints it works."""
    fleet.reset(fleet.a1, "capacity/x", "pool=a")
    fleet.reset(fleet.a2, "capacity/x")
    fleet.reset(fleet.b, "pool=b")
    scaler = tcp(fleet, "scaler-secret-1", tmp_path)
    result = scaler.run("taints", "set", "-l", "capacity/x", "capacity/y", "-o", "json")
    assert result.code == 1
    changes = {c["id"]: c for c in json.loads(result.out)}
    assert changes[fleet.a2]["after"] == ["capacity/y"] and changes[fleet.a2]["error"] is None
    failure = changes[fleet.a1]["error"]
    assert (
        failure["code"] == "PERMISSION_DENIED" and "'pool=a' is outside them" in failure["message"]
    )
    (line,) = result.err.splitlines()
    assert line.startswith(f"dynamoctl: error: worker {fleet.a1[:8]}") and "pool=a" in line
