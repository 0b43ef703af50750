"""``dynamod demo`` as a newcomer first runs it: what it prints before its banner. The
daemon's own ready line once came first, saying ``workers=0`` right above a banner that
listed three workers."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.support.processes import BIN, Lines, Spawned
from tests.support.servers import free_port

BANNER = "dynamod demo is running"


def test_the_demo_says_nothing_of_zero_workers_before_its_banner(tmp_path: Path) -> None:
    argv = [str(BIN / "dynamod"), "demo", "--workers", "2", "--dir", str(tmp_path / "demo"),
            "--http", f"127.0.0.1:{free_port()}"]  # fmt: skip
    demo = Spawned(argv, BANNER, tmp_path / "demo.log")
    try:
        assert demo.proc.stdout is not None
        lines = Lines(demo.proc.stdout.fileno(), "dynamod demo")
        before = []
        while (line := lines.next(120.0)) is not None and BANNER not in line:
            before.append(line)
        assert line is not None, f"the demo ended before its banner:\n{demo.log}"
        assert not [b for b in before if "workers=0" in b], before
        banner = []
        while (line := lines.next(10.0)) is not None and not line.startswith("Try,"):
            banner.append(line)
        listed = [b for b in banner if b.startswith("    ") and "(" in b]
        assert len(listed) == 2, banner
        assert demo.stop(signal.SIGINT) == 0, demo.log
    finally:
        demo.kill()
