"""What dynamoctl prints, format by format, against a daemon whose workers have pinned ids
and addresses (records registered before it started), compared with golden files."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
import yaml

from tests.cli.conftest import (
    Cli,
    Cluster,
    golden,
    normalize_age,
    record,
    register_records,
    start_cluster,
)

FAST = "3f2a9c1e0a000001"
SLOW = "3f2a9c1e7b000002"
MISTRAL = "c0ffee0000000003"


@pytest.fixture(scope="module")
def pinned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("pinned")
    register_records(
        (root / "store").as_uri(),
        [
            record(FAST, taints=["capacity/fast"], topology={"zone": "a"}, port=8001),
            record(SLOW, taints=["capacity/slow", "pool=batch"], port=8002),
            record(MISTRAL, model="mistral", port=8003),
        ],
    )
    started = start_cluster(root)
    assert "workers=3" in started.daemon.ready_line
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def cli(pinned: Cluster) -> Cli:
    return pinned.cli


def test_workers_table_shows_unique_short_ids_and_taints(cli: Cli) -> None:
    """The first two ids share 8 characters, so every ID is cut at 9; TAINTS is a column."""
    golden("workers-ls.txt", normalize_age(cli.ok("workers", "ls").out))


def test_workers_wide_adds_topology_revision_and_mdcsum(cli: Cli) -> None:
    golden("workers-ls-wide.txt", normalize_age(cli.ok("workers", "ls", "-o", "wide").out))


def test_no_headers_leaves_only_the_rows(cli: Cli) -> None:
    lines = cli.ok("workers", "ls", "--no-headers").lines
    assert [line.split()[0] for line in lines] == ["3f2a9c1e0", "3f2a9c1e7", "c0ffee000"]


def test_workers_json_is_one_array_with_the_documented_keys(cli: Cli) -> None:
    out = cli.ok("workers", "ls", "-o", "json").out
    golden("workers-ls.json", out)
    workers = json.loads(out)
    assert [w["id"] for w in workers] == [FAST, SLOW, MISTRAL]
    fast = workers[0]
    # the complete set the router matches on, and who manages which part of it
    assert fast["taints"] == ["capacity/fast", "dynamo.topology/zone=a"]
    assert fast["caller_taints"] == ["capacity/fast"]
    assert fast["generated_taints"] == ["dynamo.topology/zone=a"]
    assert fast["topology"] == {"zone": "a"}
    keys = {"id", "model", "address", "taints", "caller_taints", "generated_taints", "topology"}
    assert keys | {"revision"} <= set(fast)


def test_yaml_and_json_carry_the_same_objects(cli: Cli) -> None:
    as_json = json.loads(cli.ok("workers", "ls", "-o", "json").out)
    assert yaml.safe_load(cli.ok("workers", "ls", "-o", "yaml").out) == as_json


def test_name_output_is_full_ids(cli: Cli) -> None:
    assert cli.ok("workers", "ls", "-o", "name").lines == [FAST, SLOW, MISTRAL]


def test_global_options_work_before_and_after_the_command(cli: Cli) -> None:
    before = cli.ok("-o", "json", "workers", "ls").out
    assert cli.ok("workers", "ls", "-o", "json").out == before
    # after the command wins over before it, like a later flag
    assert cli.ok("-o", "json", "workers", "ls", "-o", "name").lines == [FAST, SLOW, MISTRAL]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["-l", "capacity/fast"], [FAST]),
        (["-l", "!pool=batch"], [FAST, MISTRAL]),
        (["-l", "model=llama,!capacity/fast"], [SLOW]),
        (["-l", "dynamo.topology/zone=a"], [FAST]),
        (["-l", "id=" + MISTRAL], [MISTRAL]),
        (["--model", "mistral"], [MISTRAL]),
        (["--model", "llama", "-l", "pool=batch"], [SLOW]),
    ],
)
def test_selectors_choose_workers(cli: Cli, args: list[str], expected: list[str]) -> None:
    assert cli.ok("workers", "ls", "-o", "name", *args).lines == expected


def test_nothing_matching_is_not_an_error(cli: Cli) -> None:
    result = cli.ok("workers", "ls", "-l", "model=nope")
    assert result.out == ""
    assert "no workers match" in result.err


def test_get_describes_one_worker_by_unique_prefix(cli: Cli) -> None:
    out = cli.ok("workers", "get", "3f2a9c1e0").out
    golden("workers-get.txt", re.sub(r"^(Age:\s+).*$", r"\1<age>", out, flags=re.M))
    assert json.loads(cli.ok("workers", "get", "c0ffee", "-o", "json").out)["id"] == MISTRAL


def test_an_ambiguous_prefix_fails_naming_the_matches(cli: Cli) -> None:
    result = cli.run("workers", "get", "3f2a")
    assert result.code == 1
    assert result.err.startswith("dynamoctl: error: worker id prefix '3f2a' is ambiguous")
    assert FAST in result.err and SLOW in result.err


def test_explain_ranks_eligible_workers_and_says_why_others_are_out(cli: Cli) -> None:
    args = ["route", "explain", "--model", "llama", "--prefer", "pool=batch=0.5"]
    golden("route-explain.txt", cli.ok(*args, "--require", "capacity/slow").out)
    ranked = json.loads(cli.ok(*args, "-o", "json").out)
    assert [c["rank"] for c in ranked["candidates"]] == [1, 2]
    assert ranked["chosen"] == SLOW  # the preferred taint lowers its cost
    excluded = json.loads(cli.ok(*args, "--require", "capacity/slow", "-o", "json").out)
    (out,) = [c for c in excluded["candidates"] if not c["eligible"]]
    assert out["id"] == FAST and "missing capacity/slow" in out["reason"]


def test_status_names_version_store_workers_and_replica(cli: Cli, pinned: Cluster) -> None:
    status = json.loads(cli.ok("status", "-o", "json").out)
    assert status["workers"] == 3
    assert status["store"] == pinned.store_url
    assert status["store_healthy"] is True
    assert status["state"] == "serving"
    assert status["endpoint"] == cli.endpoint
    text = cli.ok("status").out
    for label in ("Version:", "Store:", "Workers:", "Uptime:", "Replica:"):
        assert label in text


def test_events_without_follow_print_the_snapshot_and_stop(cli: Cli) -> None:
    table = cli.ok("events", "tail", "--no-follow").out
    iso = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", flags=re.M)
    golden("events-tail.txt", iso.sub("<time>".ljust(24), table))
    (line,) = cli.ok("events", "tail", "--no-follow", "-o", "json").lines
    event = json.loads(line)
    assert event["event"] == "RESYNC"
    assert [w["id"] for w in event["workers"]] == sorted([FAST, SLOW, MISTRAL])
