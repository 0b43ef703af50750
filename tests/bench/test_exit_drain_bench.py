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
    run = Run("async", True, True, code, stderr, 0.5)
    assert (run.reasons, run.noisy) == (reasons, bool(reasons))


DOCUMENT = """# Benchmark results

## Load with moving taints (`bench.load`)

load table

## Routing decision, in process (`bench.route`)

route table
"""
TITLE = "Exit drain (`bench.exit_drain`)"


def test_report_only_rewrites_its_own_section_and_keeps_the_others() -> None:
    """``bench.report --only exit_drain`` goes through ``splice``: a missing section is
    added at the end; a present one is replaced in place, the rest byte for byte."""
    added = splice(DOCUMENT, TITLE, ["drain table", ""])
    assert added == DOCUMENT + f"\n## {TITLE}\n\ndrain table\n"
    again = splice(added, TITLE, ["new table", ""])
    assert again == added.replace("drain table", "new table")
    inner = splice(DOCUMENT, "Load with moving taints (`bench.load`)", ["other", ""])
    assert inner == DOCUMENT.replace("load table", "other")
