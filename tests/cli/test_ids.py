"""Ids as an operator copies them: NVIDIA Dynamo's ids are etcd lease ids that share a long
prefix, so a short id cut to what tells apart the rows of one table would name several
workers of the fleet. Every short id printed (a filtered listing, a change table, a dry
run, ``events tail``) is unique across the whole fleet the daemon sees and resolves with
``workers get``; an id in decimal, as Dynamo logs it, is accepted wherever an id is."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.conftest import Cluster, record, register_records, start_cluster

# Three ids sharing 12 characters, two of them 15: only the canary carries the taint.
CANARY, TWIN, OTHER = "12c8a233af980001", "12c8a233af980002", "12c8a233b0000003"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("ids"))
    try:
        records = [
            record(CANARY, taints=["canary"], port=8001),
            record(TWIN, port=8002),
            record(OTHER, port=8003),
        ]
        register_records(cluster.store_url, records)
        cluster.seen([r.instance_id for r in records])
        yield cluster
    finally:
        cluster.stop()


def resolves(fleet: Cluster, short: str, full: str) -> None:
    shown = fleet.cli.ok("workers", "get", short, "-o", "json").out
    assert json.loads(shown)["id"] == full, f"{short!r} printed, but names another worker"


def first_cells(text: str) -> list[str]:
    return [line.split()[0] for line in text.splitlines()[1:]]


def test_a_filtered_listing_prints_an_id_unique_in_the_fleet(fleet: Cluster) -> None:
    (short,) = first_cells(fleet.cli.ok("workers", "ls", "-l", "canary").out)
    assert CANARY.startswith(short) and not TWIN.startswith(short)
    resolves(fleet, short, CANARY)


def test_a_dry_run_and_a_change_print_ids_that_resolve(fleet: Cluster) -> None:
    dry = fleet.cli.ok("taints", "add", "-l", "canary", "zone-test", "--dry-run").out
    (short,) = first_cells(dry)
    resolves(fleet, short, CANARY)
    done = fleet.cli.ok("taints", "add", "-l", "canary", "zone-test").out
    (short,) = first_cells(done)
    resolves(fleet, short, CANARY)
    fleet.cli.ok("taints", "rm", CANARY, "zone-test")


def test_every_id_in_events_tail_resolves(fleet: Cluster) -> None:
    fleet.cli.ok("taints", "add", TWIN, "tail-test")
    out = fleet.cli.ok("events", "tail", "--since", "0", "--no-follow", "--no-pools").out
    rows = [line.split() for line in out.splitlines()[1:]]
    shown = {row[3] for row in rows if row[3] != "-"}
    assert shown, out
    for short in shown:
        (full,) = [i for i in (CANARY, TWIN, OTHER) if i.startswith(short)]
        resolves(fleet, short, full)
    fleet.cli.ok("taints", "rm", TWIN, "tail-test")


def test_an_id_in_decimal_names_the_worker(fleet: Cluster) -> None:
    decimal = str(int(TWIN, 16))
    resolves(fleet, decimal, TWIN)
    changed = fleet.cli.ok("taints", "add", decimal, "decimal-test", "-o", "json").out
    assert [c["id"] for c in json.loads(changed)] == [TWIN]
    fleet.cli.ok("taints", "rm", decimal, "decimal-test")


def test_a_decimal_that_is_no_whole_id_is_still_a_prefix(fleet: Cluster, tmp_path: Path) -> None:
    """``12`` is 0xc in decimal, which no worker's whole id is: it stays the prefix of
    three ids (ambiguous), as it was."""
    refused = fleet.cli.run("workers", "get", "12")
    assert refused.code == 1
    assert "'12' is ambiguous: it matches 3 workers" in refused.err


def test_jsonpath_prints_what_kubectls_would(fleet: Cluster) -> None:
    ids = fleet.cli.ok("workers", "ls", "-o", "jsonpath={.items[*].id}").out
    assert ids == f"{CANARY} {TWIN} {OTHER}"  # as listed (by model, then id); no newline
    ranged = "{range .items[*]}{.id}{'\\t'}{.taints}{'\\n'}{end}".replace("'", '"')
    lines = fleet.cli.ok("workers", "ls", "-l", "canary", "-o", f"jsonpath={ranged}").out
    assert lines == f'{CANARY}\t["canary"]\n'
    one = fleet.cli.ok("workers", "get", TWIN, "-o", "jsonpath={.address}").out
    assert one == "http://10.0.0.2:8002"  # one object: the template sees it, not a list


def test_custom_columns_and_sort_by(fleet: Cluster) -> None:
    spec = "custom-columns=ID:.id,PORT:.address,TAINTS:.taints[*]"
    out = fleet.cli.ok("workers", "ls", "-o", spec, "--sort-by", "{.address}").lines
    assert out[0].split() == ["ID", "PORT", "TAINTS"]
    assert [line.split() for line in out[1:]] == [
        [CANARY, "http://10.0.0.1:8001", "canary"],
        [TWIN, "http://10.0.0.2:8002", "<none>"],
        [OTHER, "http://10.0.0.3:8003", "<none>"],
    ]
    by_taint = fleet.cli.ok("workers", "ls", "--sort-by=.taints[0]", "-o", "name").lines
    assert by_taint[0] == CANARY  # the only one with a taint; the others, missing it, last
    table = fleet.cli.ok("workers", "ls", "--sort-by", ".address", "--no-headers").out
    assert table.split()[0] == CANARY[: len(table.split()[0])]  # the table, sorted too


def test_a_template_that_does_not_parse_is_a_usage_error(fleet: Cluster) -> None:
    bad = fleet.cli.run("workers", "ls", "-o", "jsonpath={.items[")
    assert bad.code == 2 and "unbalanced brace" in bad.err
    bad = fleet.cli.run("workers", "ls", "-o", "custom-columns=ID")
    assert bad.code == 2 and "must look like HEADER:.path" in bad.err
    bad = fleet.cli.run("workers", "ls", "--sort-by", ".items[zz]")
    assert bad.code == 2 and "[zz] is not an index" in bad.err
