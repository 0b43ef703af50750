"""The bounded drain at exit: leftovers get one bounded wait, are named, and the process
ends without asyncio or interpreter noise."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.procs import BAD_STDERR, ROOT, env

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
