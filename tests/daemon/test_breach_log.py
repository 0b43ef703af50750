"""What the daemon logs about breaches at fleet scale (``boundary/breach_log.py``): the first
of a kind at once, the rest of the interval as one summary, however many workers; and the
daemon's open files (``dynamod/open_files.py``)."""

from __future__ import annotations

import asyncio
import logging
import resource

import pytest
from prometheus_client import CollectorRegistry

from dynamod.boundary import Breach, Breaches, BreachKind
from dynamod.boundary.breach_log import BreachLog
from dynamod.open_files import OpenFiles, open_count, raise_limit, soft_limit
from dynamod.tasks import cancel_and_wait
from tests.support.eventually import eventually

LOGGER = "tests.breach_log"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_a_partition_of_5000_workers_costs_two_lines_a_kind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = Clock()
    lines = BreachLog(logging.getLogger(LOGGER), interval=10.0, clock=clock)
    for i in range(5000):
        lines.note("were marked (timeout)", f"w{i}", f"worker w{i} timed out")
        clock.now += 0.001
    assert messages(caplog) == ["worker w0 timed out"]
    clock.now += 10
    assert lines.flush() is None
    assert messages(caplog)[1:] == [
        "4999 more workers were marked (timeout) in the last 10 s: w1, w2, w3 and 4996 more "
        "(dynamoctl workers ls shows each)"
    ]


def test_kinds_are_summarised_apart_and_a_new_window_logs_its_first_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = Clock()
    lines = BreachLog(logging.getLogger(LOGGER), interval=10.0, clock=clock)
    lines.note("refused", "a", "a refused")
    lines.note("lifted", "b", "b lifted", logging.INFO)
    for _ in range(3):
        lines.note("refused", "a", "a refused")  # the same worker, retried
    lines.note("refused", "c", "c refused")
    assert lines.flush() == 110.0  # both windows still open
    clock.now = 111.0
    lines.note("refused", "d", "d refused")  # closes the last window, opens a new one
    lines.close()
    assert messages(caplog) == [
        "a refused",
        "b lifted",
        "1 more workers refused in the last 10 s (4 times in all): c "
        "(dynamoctl workers ls shows each)",
        "d refused",
    ]
    levels = [r.levelno for r in caplog.records if r.name == LOGGER]
    assert levels[1] == logging.INFO and levels[0] == logging.WARNING


async def test_run_closes_a_window_when_it_ends_without_more_traffic(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    lines = BreachLog(logging.getLogger(LOGGER), interval=0.05)
    task = asyncio.create_task(lines.run())
    lines.note("marked", "a", "a marked")
    lines.note("marked", "a", "a marked")

    async def logged() -> int:
        return len(messages(caplog))

    await eventually(logged, lambda n: n >= 2, every=0.01, what="the summary")
    await cancel_and_wait(task)
    assert messages(caplog) == [
        "a marked",
        "the same worker marked 1 more times in the last 0.05 s: a",
    ]


def test_breaches_log_through_their_breach_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = Clock()
    lines = BreachLog(logging.getLogger(LOGGER), interval=10.0, clock=clock)
    breaches = Breaches(lambda key, load: None, lines=lines)
    for i in range(100):
        breaches.breach(Breach(f"w{i}", BreachKind.TIMEOUT, "silent"))
    for i in range(100):
        breaches.clear(f"w{i}")
    lines.close()
    assert len(breaches) == 0
    assert messages(caplog) == [
        "worker w0 broke the daemon's boundary (timeout): silent",
        "worker w0 is within the daemon's boundary again",
        "99 more workers were marked (timeout) in the last 10 s: w1, w2, w3 and 96 more "
        "(dynamoctl workers ls shows each)",
        "99 more workers are within the daemon's boundary again in the last 10 s: w1, w2, w3 "
        "and 96 more (dynamoctl workers ls shows each)",
    ]


def test_open_files_are_counted_against_the_soft_limit_less_a_reserve() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(512, hard), hard))
        limit = raise_limit()
        assert limit.was == min(512, hard) and limit.soft == soft_limit()
        assert limit.soft == hard or hard == resource.RLIM_INFINITY
        registry = CollectorRegistry()
        files = OpenFiles(registry, reserve=100)
        assert files.streams == soft_limit() - 100
        assert registry.get_sample_value("dynamod_open_files_limit") == soft_limit()
        assert 0 < open_count() < soft_limit()
        opened = registry.get_sample_value("dynamod_open_files")
        assert opened is not None and opened > 0
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
