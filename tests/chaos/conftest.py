"""Figures the chaos scenarios measure, for ``bench.report``.

A scenario records what it measured (``figures.record("removed_after_s", 1.9)``). When
``DYNAMO_CHAOS_FIGURES`` names a file, each test's figures are appended to it as one JSON
line (``{"test": node id, "figures": {...}}``); otherwise they are only kept in memory, so a
plain test run writes nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.harness import FIGURES_ENV, Figures


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[Figures]:
    found = Figures()
    yield found
    target = os.environ.get(FIGURES_ENV)
    if target and found.values:
        line = json.dumps({"test": request.node.nodeid, "figures": found.values}, default=str)
        with Path(target).open("a") as out:
            out.write(line + "\n")
