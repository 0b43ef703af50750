"""The suite's own session-end check: a process a test started and left running fails the
run, named by its command line, and is killed (tests/support/leftovers.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
LEAKY = """
import subprocess
import sys


def test_leaves_a_process_behind():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "left-behind"])
"""
TIDY = """
import subprocess
import sys


def test_waits_for_its_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
"""


def inner_run(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    """A pytest session of its own in ``tmp_path`` with this suite's check and ``body``."""
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import nothing_outlives_the_suite\n\n"
        '__all__ = ["nothing_outlives_the_suite"]\n'
    )
    (tmp_path / "test_inner.py").write_text(body)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_inner.py"]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True)


def still_running(marker: str) -> list[int]:
    return [
        process.pid
        for process in psutil.process_iter(["cmdline", "status"])
        if marker in (process.info["cmdline"] or []) and process.info["status"] != "zombie"
    ]


def test_a_process_left_running_fails_the_run_naming_it(tmp_path: Path) -> None:
    done = inner_run(tmp_path, LEAKY)
    assert done.returncode != 0, done.stdout
    assert "outlived it" in done.stdout and "left-behind" in done.stdout, done.stdout
    assert still_running("left-behind") == [], "the check did not kill what it found"


def test_a_suite_that_waits_for_its_processes_passes(tmp_path: Path) -> None:
    done = inner_run(tmp_path, TIDY)
    assert done.returncode == 0, done.stdout + done.stderr
