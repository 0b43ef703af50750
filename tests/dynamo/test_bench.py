"""The Dynamo fleet benchmark's report, without Dynamo: its tables from a document, and
its section of RESULTS.md kept when ``bench.report`` regenerates the rest."""

from __future__ import annotations

from bench import dynamo_fleet
from bench.report import DYNAMO_FLEETS, kept_section, splice

STATS = {"n": 3, "p50_ms": 1.5, "p99_ms": 2.5, "min_ms": 1.0, "max_ms": 2.5}
DOCUMENT = {
    "command": "python -m bench.dynamo_fleet --samples 3",
    "ai_dynamo": "1.6.1",
    "load_before": [1.0, 2.0, 3.0],
    "taint_changes": {
        "curl to the route (floor)": {
            "command": STATS,
            "routed": STATS,
            "first_routed": 2,
            "samples": 3,
        },
    },
    "listing": {
        "cards": 1000,
        "ready_s": 2.5,
        "own_ready_s": 1.5,
        "daemon_rss_mb": 90.0,
        "rows": {"dynamoctl workers ls": STATS},
    },
}


def test_the_section_shows_every_way_and_listing() -> None:
    text = "\n".join(dynamo_fleet.section(DOCUMENT))
    assert "| curl to the route (floor) | 1.500 | 2.500 | 1.500 | 2.500 | 2 of 3 |" in text
    assert "| dynamoctl workers ls | 1.500 | 2.500 | 1.000 |" in text
    assert "| dynamod start → ready with 1000 Dynamo cards | 2500.000 | — | — |" in text
    assert "python -m bench.dynamo_fleet --samples 3" in text


def test_the_section_survives_a_report_that_does_not_rerun_it() -> None:
    body = dynamo_fleet.section(DOCUMENT)
    written = splice("# Benchmark results\n", DYNAMO_FLEETS, body)
    regenerated = splice("# Benchmark results\n\n## Other\n", DYNAMO_FLEETS,
                         kept_section(written, DYNAMO_FLEETS) or [])  # fmt: skip
    assert regenerated.endswith("\n".join(body).rstrip("\n") + "\n")
