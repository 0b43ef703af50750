"""The exit-drain experiment's arithmetic: the Fisher exact test, what counts as a noisy
exit, and the report splicing one section into RESULTS.md without touching the rest."""

from __future__ import annotations

import pytest

from bench.exit_drain import Run, fisher_exact
from bench.report import splice

# Two-sided p-values computed with scipy 1.17.1 (scipy.stats.fisher_exact) on this machine.
REFERENCE = [
    ((1, 9, 11, 3), 0.0027594561852200836),
    ((7, 17, 15, 5), 0.005768386750469949),
    ((14, 886, 10, 890), 0.5385048078724439),
    ((3, 997, 0, 1000), 0.24962481240620307),
    ((0, 1000, 0, 1000), 1.0),
    ((0, 200, 200, 0), 1.942643449522235e-119),
]


@pytest.mark.parametrize(("table", "expected"), REFERENCE)
def test_fisher_exact_matches_scipy(table: tuple[int, int, int, int], expected: float) -> None:
    assert fisher_exact(*table) == pytest.approx(expected, rel=1e-9)


def test_fisher_exact_is_symmetric_in_the_arms() -> None:
    assert fisher_exact(14, 886, 10, 890) == pytest.approx(fisher_exact(10, 890, 14, 886))


@pytest.mark.parametrize(
    ("code", "stderr", "reasons"),
    [
        (0, "", []),
        (0, "dynamod.client.drain: still open at exit, left as is: x\n", []),
        (1, "", ["exit 1"]),
        (None, "", ["hung"]),
        (0, "Task was destroyed but it is pending!\n", ["Task was destroyed"]),
        (0, "Exception ignored in: <function X.__del__>\n", ["Exception ignored"]),
        (134, "Fatal Python error: Aborted\n", ["Fatal Python error", "exit 134"]),
        (0, "Traceback (most recent call last):\n", ["Traceback"]),
    ],
)
def test_what_counts_as_a_noisy_exit(code: int | None, stderr: str, reasons: list[str]) -> None:
    run = Run("async", True, code, stderr, 0.5)
    assert (run.reasons, run.noisy) == (reasons, bool(reasons))


DOCUMENT = """# Benchmark results

## Headline

| a | b |

## Load with moving taints (`bench.load`)

load table

## Routing decision, in process (`bench.route`)

route table
"""


def test_splice_adds_a_missing_section_before_the_routing_one_and_touches_nothing_else() -> None:
    added = splice(DOCUMENT, "Exit drain (`bench.exit_drain`)", ["drain table", ""])
    assert added == DOCUMENT.replace(
        "## Routing decision",
        "## Exit drain (`bench.exit_drain`)\n\ndrain table\n\n## Routing decision",
    )
    again = splice(added, "Exit drain (`bench.exit_drain`)", ["new table", ""])
    assert again == added.replace("drain table", "new table")
    last = splice(DOCUMENT, "Routing decision, in process (`bench.route`)", ["other", ""])
    assert last.endswith("## Routing decision, in process (`bench.route`)\n\nother\n")
    assert last.startswith(DOCUMENT.split("## Routing")[0])
