"""The bounded drain at exit: leftovers get one bounded wait, are named, and the process
ends without asyncio or interpreter noise."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from dynamod.client import drain
from dynamod.lifecycle import exit_drain_seconds
from tests.support.processes import BAD_STDERR, ROOT, env

PROGRAM = textwrap.dedent(
    """
    import asyncio, logging, sys, threading, time
    from dynamod.lifecycle import run
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")

    async def main() -> int:
        mode = sys.argv[1]
        if mode in ("task", "both"):
            asyncio.get_running_loop().create_task(asyncio.Event().wait(), name="stuck forever")
        if mode in ("thread", "both"):
            threading.Thread(target=time.sleep, args=(30,), name="sleepy").start()
        if mode == "short":
            asyncio.get_running_loop().create_task(asyncio.sleep(0.2), name="finishes soon")
        await asyncio.to_thread(sum, [1, 2])
        return 7

    sys.exit(run(main, drain=0.5))
    """
)


def run_program(mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, mode],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env(),
        timeout=30,
        check=False,
    )


def assert_quiet(result: subprocess.CompletedProcess[str]) -> None:
    for bad in BAD_STDERR:
        assert bad not in result.stderr, result.stderr


def test_nothing_left_exits_normally() -> None:
    result = run_program("none")
    assert result.returncode == 7
    assert "still alive" not in result.stderr
    assert_quiet(result)


def test_a_task_that_ends_within_the_bound_is_waited_for() -> None:
    result = run_program("short")
    assert result.returncode == 7
    assert "still alive" not in result.stderr
    assert_quiet(result)


def test_leftover_tasks_and_threads_are_named_and_left_alone() -> None:
    result = run_program("both")
    assert result.returncode == 7
    assert "still alive at exit, left as is: task 'stuck forever'" in result.stderr
    assert "still alive at exit, left as is: thread 'sleepy'" in result.stderr
    assert_quiet(result)


# --- the bound: 250 ms by default, DYNAMO_DRAIN to change it ---


def test_the_drain_bound_is_250_ms_unless_dynamo_drain_says_otherwise(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("DYNAMO_DRAIN", raising=False)
    assert exit_drain_seconds() == 0.25
    monkeypatch.setenv("DYNAMO_DRAIN", "1.5")
    assert exit_drain_seconds() == 1.5
    monkeypatch.setenv("DYNAMO_DRAIN", "0")
    assert exit_drain_seconds() == 0.0
    for bad in ("soon", "-1", "inf", "nan"):
        monkeypatch.setenv("DYNAMO_DRAIN", bad)
        assert exit_drain_seconds() == 0.25
        assert f"DYNAMO_DRAIN={bad!r} is not a number of seconds >= 0; using 0.25" in caplog.text


def test_the_bound_from_the_environment_is_the_one_run_waits() -> None:
    """A task that needs 0.6 s: cut short under the default, waited for under 2 s."""
    script = PROGRAM.replace("sys.exit(run(main, drain=0.5))", "sys.exit(run(main))").replace(
        "asyncio.sleep(0.2)", "asyncio.sleep(0.6)"
    )
    default = subprocess.run(
        [sys.executable, "-c", script, "short"], capture_output=True, text=True, cwd=ROOT,
        env={k: v for k, v in env().items() if k != "DYNAMO_DRAIN"}, timeout=30, check=False,
    )  # fmt: skip
    longer = subprocess.run(
        [sys.executable, "-c", script, "short"], capture_output=True, text=True, cwd=ROOT,
        env=env(DYNAMO_DRAIN="2"), timeout=30, check=False,
    )  # fmt: skip
    assert default.returncode == longer.returncode == 7
    assert "still alive at exit, left as is: task 'finishes soon'" in default.stderr
    assert "still alive" not in longer.stderr
    assert_quiet(default)
    assert_quiet(longer)


# --- the client's drain of its own forgotten connections ---


class Forgotten:
    """A client as the drain sees one (the ``Drainable`` protocol): it closes what it can
    by the deadline and names what it could not."""

    def __init__(self, left: list[str]) -> None:
        self.left = left
        self.deadlines: list[float] = []

    def drain_at_exit(self, deadline: float) -> list[str]:
        self.deadlines.append(deadline)
        return self.left


def test_the_client_drain_closes_what_is_open_and_logs_what_remains(
    caplog: pytest.LogCaptureFixture,
) -> None:
    closed, stuck = Forgotten([]), Forgotten(["thread 'dynamod-client x'"])
    drain.track(closed)
    drain.track(stuck)
    try:
        before = time.monotonic()
        assert drain.drain_all(0.25) == ["thread 'dynamod-client x'"]
        assert closed.deadlines == stuck.deadlines
        assert before + 0.25 <= closed.deadlines[0] <= time.monotonic() + 0.25
        assert "still open at exit, left as is: thread 'dynamod-client x'" in caplog.text
        assert drain.drain_all(0) == []  # DYNAMO_DRAIN=0: nothing is touched
        assert len(closed.deadlines) == 1
    finally:
        drain.forget(closed)
        drain.forget(stuck)
