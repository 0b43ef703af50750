"""The Dynamo fleet benchmarks' reports, without Dynamo: their tables from a document, and
the fleet bench's section of RESULTS.md kept when ``bench.report`` regenerates the rest."""

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


def test_the_records_bench_tables_show_each_call_against_its_floor() -> None:
    from bench import dynamo_records

    loras = {"loras": 5000, "seen_s": 30.0, "daemon_cpu_s": 1.5, "rss_before_mb": 72.0,
             "rss_peak_mb": 79.0, "rss_after_mb": 78.0, "status_quiet": STATS,
             "status_busy": STATS, "store_quiet": STATS, "store_busy": STATS}  # fmt: skip
    headers, rows = dynamo_records.lora_table(loras)
    assert headers[0] == "call" and len(rows) == 4
    assert rows[1][0].startswith("dynamoctl status, while 5,000 LoRA cards")
    assert "the daemon used 1.5 s of CPU" in rows[1][0] and rows[1][-1] == "72 → peak 79 → 78"
    assert rows[3][0].startswith("etcd get v1, status's own read (floor)")
    large = {"etcd": {"rss_before_mb": 72.0, "rss_after_mb": 75.0}}
    assert dynamo_records.large_table(large)[1] == [["etcd", "72", "75", "+3"]]
