"""The columns of a stream (``workers ls --watch``; ``events tail`` too) are bounded: after one
worker holding hundreds of taints, later lines are not padded to its width; the long cell
is cut, ending in ``…`` (``-o json`` has it whole)."""

from __future__ import annotations

import io

from dynamoctl.output import Printer
from dynamoctl.watch import MAX_CELL, WorkerWatch
from dynamod.reports import EventInfo
from dynamod.results import WorkerInfo
from tests.cli.conftest import record

MANY = [f"batch={n:03d}" for n in range(400)]


def events() -> list[EventInfo]:
    crowded = WorkerInfo(record("aaaa000000000001", taints=MANY), 2)
    plain = WorkerInfo(record("bbbb000000000002", taints=["pool=a"], port=8001), 3)
    return [EventInfo("ADDED", 2, 0.0, crowded), EventInfo("ADDED", 3, 0.0, plain)]


def test_watch_lines_stay_bounded_after_a_worker_with_400_taints() -> None:
    out = io.StringIO()
    watch = WorkerWatch(Printer("table", stdout=out))
    for event in events():
        watch.feed(event)
    header, crowded, plain = out.getvalue().splitlines()
    taints = crowded.split()[4]
    assert taints.endswith("…") and len(taints) == MAX_CELL
    assert len(plain) < 2 * MAX_CELL + len(header)
    assert "pool=a" in plain.split()
