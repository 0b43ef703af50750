"""The pure parts of what dynamoctl shows: short ids, ages, change lines, preferences."""

from __future__ import annotations

import pytest
import typer

from dynamoctl.commands.route import parse_preferences
from dynamoctl.formats import age, change_text, iso_time, short_ids


def test_short_ids_are_the_shortest_unique_prefix_of_at_least_8() -> None:
    assert short_ids(["3f2a9c1e0a000001"]) == {"3f2a9c1e0a000001": "3f2a9c1e"}
    ids = ["3f2a9c1e0a000001", "3f2a9c1e7b000002", "c0ffee0000000003"]
    assert set(short_ids(ids).values()) == {"3f2a9c1e0", "3f2a9c1e7", "c0ffee000"}
    assert short_ids([]) == {}


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0, "0s"), (119, "119s"), (125, "2m5s"), (599, "9m59s"), (600, "10m"),
     (3 * 3600 + 5 * 60, "3h5m"), (9 * 3600, "9h"), (2 * 86400 + 3 * 3600, "2d3h"),
     (9 * 86400, "9d"), (-5, "0s")],
)  # fmt: skip
def test_age_reads_like_kubectl(seconds: float, shown: str) -> None:
    assert age(seconds) == shown


def test_change_text_lists_additions_then_removals() -> None:
    assert change_text(["capacity/fast"], ["pool=slow"]) == "+capacity/fast -pool=slow"
    assert change_text([], []) == "unchanged"


def test_iso_time_is_utc_with_milliseconds() -> None:
    assert iso_time(1_700_000_000.1234) == "2023-11-14T22:13:20.123Z"


def test_preferences_take_the_weight_after_the_last_equals_sign() -> None:
    assert parse_preferences(["pool=batch=0.5", "capacity/fast=-1"]) == {
        "pool=batch": 0.5,
        "capacity/fast": -1.0,
    }
    for bad in ("fast", "=1", "pool=x"):
        with pytest.raises(typer.BadParameter, match="must look like TAINT=WEIGHT"):
            parse_preferences([bad])


def test_what_a_dynamo_worker_does_not_report_shows_as_a_dash() -> None:
    from dataclasses import replace

    from dynamoctl.formats import worker_details, worker_row
    from dynamod.results import WorkerInfo
    from tests.cli.conftest import record

    bare = replace(record("d1a0000000000001"), pid=0, version="", started_at=0.0)
    details = dict(worker_details(WorkerInfo(bare, 1)))
    assert (details["Host"], details["Version"], details["Age"]) == ("node-a", "-", "-")
    assert worker_row(WorkerInfo(bare, 1), "d1a00000", wide=False, now=0.0)[-1] == "-"


def test_a_bulk_failure_names_its_worker_once() -> None:
    from dynamoctl.updates import failure_line
    from dynamod.results import UpdateFailure, UpdateOutcome

    def failed(message: str) -> UpdateOutcome:
        return UpdateOutcome("abcd0001", "k", (), (), 1, UpdateFailure("UNAVAILABLE", message))

    said = "worker abcd0001's route did not answer"
    assert failure_line(failed(said), "abcd0001") == said
    assert failure_line(failed("refused"), "abcd0001") == "worker abcd0001: refused"
