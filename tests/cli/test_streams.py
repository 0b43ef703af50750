"""Streams: ``events tail -o json`` read line by line while taints change, ``workers ls
--watch`` through a worker's whole life, resuming with ``--since``, and how a stream ends
(Ctrl-C, the reader of a pipe going away, the daemon going away)."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from tests.cli.conftest import Cluster, Stream, record, register_records, start_cluster
from tests.support.processes import daemon_argv, dynamoctl, started

pytestmark = pytest.mark.timeout(180)


def test_events_tail_json_lines_follow_taint_changes(cluster: Cluster) -> None:
    (worker,) = cluster.start_workers(("tail", ["--taint", "pool=a"]))
    wid = worker.field("id")
    cluster.seen([wid])
    with Stream(cluster.cli, "events", "tail", "-o", "json", "-l", "model=tail") as tail:
        first = tail.event()
        assert first["event"] == "RESYNC" and [w["id"] for w in first["workers"]] == [wid]
        cluster.cli.ok("taints", "add", wid, "capacity/fast")
        cluster.cli.ok("taints", "set", wid, "capacity/slow")
        added, replaced = tail.event(), tail.event()
        assert (added["event"], added["worker"], added["added"]) == (
            "TAINTS",
            wid,
            ["capacity/fast"],
        )
        assert replaced["added"] == ["capacity/slow"]
        assert replaced["removed"] == ["capacity/fast", "pool=a"]
        assert replaced["taints"] == ["capacity/slow"]
        assert first["revision"] < added["revision"] < replaced["revision"]
        ended = tail.stop()
    assert (ended.code, ended.out, ended.err) == (0, "", "")


def test_after_a_clear_events_still_show_what_the_router_matches_on(cluster: Cluster) -> None:
    """Issue 15 item 2: a consumer of the event stream must not conclude that a cleared
    worker holds nothing while the router still matches on its topology taints."""
    (worker,) = cluster.start_workers(("zoned", ["--taint", "pool=a", "--topology", "zone=z1"]))
    wid = worker.field("id")
    cluster.seen([wid])
    topology = "dynamo.topology/zone=z1"
    with Stream(cluster.cli, "events", "tail", "-o", "json", "-l", f"id={wid}") as tail:
        (shown,) = tail.event()["workers"]
        assert (shown["taints"], shown["generated_taints"]) == (
            ["dynamo.topology/zone=z1", "pool=a"],
            [topology],
        )
        cluster.cli.ok("taints", "clear", wid)
        cleared = tail.event()
        assert (cleared["event"], cleared["removed"]) == ("TAINTS", ["pool=a"])
        assert cleared["taints"] == [topology]
        assert (cleared["caller_taints"], cleared["generated_taints"]) == ([], [topology])
        assert tail.stop().code == 0
    table = cluster.cli.ok("events", "tail", "--since", str(cleared["revision"] - 1),
                           "--no-follow", "-l", f"id={wid}").lines  # fmt: skip
    assert table[-1].split()[-1] == "-pool=a"
    listed = json.loads(cluster.cli.ok("workers", "ls", "-l", f"id={wid}", "-o", "json").out)
    assert listed[0]["taints"] == [topology]


def test_since_replays_what_happened_after_a_revision(cluster: Cluster) -> None:
    (worker,) = cluster.start_workers(("since", []))
    wid = worker.field("id")
    cluster.seen([wid])
    (change,) = json.loads(cluster.cli.ok("taints", "add", wid, "r1", "-o", "json").out)
    cluster.cli.ok("taints", "add", wid, "r2")
    replay = cluster.cli.ok(
        "events", "tail", "--since", str(change["revision"] - 1), "--no-follow", "-o", "json",
        "-l", f"id={wid}",
    )  # fmt: skip
    events = [json.loads(line) for line in replay.lines]
    assert [(e["event"], e["added"]) for e in events] == [("TAINTS", ["r1"]), ("TAINTS", ["r2"])]


def test_watch_lists_workers_then_their_changes_then_their_end(cluster: Cluster) -> None:
    (worker,) = cluster.start_workers(("watched", ["--taint", "pool=w"]))
    wid = worker.field("id")
    cluster.seen([wid])
    with Stream(cluster.cli, "workers", "ls", "--watch", "--model", "watched") as watch:
        header = watch.line().split()
        assert header == ["EVENT", "ID", "MODEL", "ADDRESS", "TAINTS", "STATE", "LOAD", "AGE"]
        assert watch.line().split()[:5] == [
            "ADDED",
            wid[:8],
            "watched",
            worker.field("http"),
            "pool=w",
        ]
        cluster.cli.ok("taints", "add", wid, "x")
        assert watch.line().split()[:5] == [
            "TAINTS",
            wid[:8],
            "watched",
            worker.field("http"),
            "pool=w,x",
        ]
        assert worker.stop() == 0  # deregisters on the way out
        assert watch.line().split()[:2] == ["REMOVED", wid[:8]]
        assert watch.stop().code == 0


def test_a_stream_ends_when_the_reader_of_its_pipe_does(cluster: Cluster) -> None:
    """``events tail | head -1``: head exits after one line and so does dynamoctl, at once,
    although no further event comes to write; 141 as for SIGPIPE, nothing on stderr."""
    read, write = os.pipe()
    tail = subprocess.Popen(
        dynamoctl("events", "tail"), stdout=write, stderr=subprocess.PIPE, env=cluster.cli.env()
    )
    os.close(write)
    with os.fdopen(read, "rb") as reader:
        assert reader.readline().split()[0] == b"TIME"
    _, err = tail.communicate(timeout=30)
    assert (tail.returncode, err) == (141, b"")


def holds(event: dict[str, Any], taint: str) -> bool:
    """A TAINTS event that added ``taint``, or a snapshot in which a worker holds it."""
    if event["event"] == "RESYNC":
        return any(taint in w["taints"] for w in event["workers"])
    return taint in event.get("added", [])


@pytest.mark.parametrize("argv", [("events", "tail", "--no-pools"), ("workers", "ls", "--watch")])
def test_a_stream_resumes_after_dynamod_restarts(
    tmp_path_factory: pytest.TempPathFactory, argv: tuple[str, ...]
) -> None:
    """The daemon stops and starts again on the same socket: the stream says so on stderr,
    reconnects by itself and goes on with what happened meanwhile."""
    root = tmp_path_factory.mktemp("restart")
    own = start_cluster(root)
    worker = "7e57a17000000001"
    try:
        register_records(own.store_url, [record(worker)])
        own.seen([worker])
        with Stream(own.cli, *argv, "-o", "json") as stream:
            stream.event()  # the snapshot, or the first worker: the stream is up
            assert own.daemon.stop() == 0
            argv_again = daemon_argv(own.store_url, root / "d.sock")
            own.daemon = started(argv_again, r"^dynamod ready:", root / "dynamod-again.log")
            own.cli.ok("taints", "add", worker, "after-restart")
            if argv[0] == "events":
                while not holds(stream.event(within=60), "after-restart"):
                    pass
            else:
                while "after-restart" not in stream.event(within=60)["worker"]["taints"]:
                    pass
            ended = stream.stop()
    finally:
        own.stop()
    assert ended.code == 0
    assert "dynamod ended the stream" in ended.err or "lost dynamod" in ended.err
    assert "reconnecting to resume" in ended.err
    assert "reconnected to dynamod; resumed after revision" in ended.err
