"""``dynamoctl top`` as an operator runs it: under a real terminal (tmux) on a real fleet
of three mocker workers — one cordoned, one in a pool, one serving a long streaming
request — and without a terminal (``--once``, a piped stdout, ``-o json``)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.observe.fleet import Fleet, stream_request, tool
from tests.support.eventually import eventually_blocking
from tests.support.processes import Spawned, dynamoctl

POLICY = "name: split\nselector: role=pooled\npools:\n  pool=a: 100\n  pool=b: 1\n"
"""One worker matches: pool=a gets it (the largest remainder), pool=b none."""


@dataclass
class Three:
    fleet: Fleet
    daemon: Spawned
    cordoned: str
    pooled: str
    long: str


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Three]:
    """dynamod and three workers: one cordoned, one the policy ``split`` puts in
    ``pool=a``, one slow (``slot/long``) for long streams."""
    root = tmp_path_factory.mktemp("top")
    fleet = Fleet(root, (root / "store").as_uri())
    try:
        daemon = fleet.daemon("d1")
        cordoned, pooled, long = fleet.start_workers(
            ("--taint", "role=plain"),
            ("--taint", "role=pooled"),
            ("--taint", "slot/long", "--speedup-ratio", "0.2"),
        )
        fleet.ctl(daemon, "workers", "cordon", cordoned)
        (root / "split.yaml").write_text(POLICY)
        fleet.ctl(daemon, "pools", "apply", "-f", str(root / "split.yaml"))
        eventually_blocking(
            lambda: "pool=a" in fleet.ctl(daemon, "workers", "get", pooled).stdout,
            what="the pool leader's move of the pooled worker",
        )
        yield Three(fleet, daemon, cordoned, pooled, long)
    finally:
        fleet.stop()


class Tmux:
    """A tmux server of this test's own (its own socket), one window of ``width`` x
    ``height`` running ``command``; ``screen()`` is what the terminal shows."""

    def __init__(self, binary: str, root: Path, command: str, environ: dict[str, str]) -> None:
        self.binary = binary
        self.socket = f"dynamod-top-{os.getpid()}-{time.monotonic_ns()}"
        script = root / "run.sh"
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in environ.items())
        # The window's own size, not one a terminal multiplexer passed down (COLUMNS=80
        # reaches the pane of a server started without a terminal).
        script.write_text(f"#!/bin/sh\nunset COLUMNS LINES\n{exports}{command}\n")
        script.chmod(0o755)
        self.tmux("new-session", "-d", "-s", "top", "-x", "160", "-y", "40", str(script))

    def tmux(self, *args: str) -> str:
        done = subprocess.run(
            [self.binary, "-L", self.socket, *args], capture_output=True, text=True, timeout=30,
            check=True,
        )  # fmt: skip
        return done.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "top")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "top", *keys)

    def showing(self, *texts: str, within: float = 60) -> str:
        """The screen once it shows every one of ``texts``."""
        shown = [""]

        def probe() -> str | None:
            shown[0] = self.screen()
            return shown[0] if all(t in shown[0] for t in texts) else None

        try:
            return eventually_blocking(probe, within=within, what=f"the terminal showing {texts}")
        except AssertionError as exc:
            size = self.tmux("display", "-p", "-t", "top", "#{window_width}x#{window_height}")
            raise AssertionError(f"{exc}\nthe screen ({size.strip()}):\n{shown[0]}") from None

    def close(self) -> None:
        subprocess.run([self.binary, "-L", self.socket, "kill-server"], capture_output=True,
                       timeout=30, check=False)  # fmt: skip


def rows_by_id(screen: str, ids: list[str]) -> dict[str, str]:
    return {i: next(line for line in screen.splitlines() if line.startswith(i[:8])) for i in ids}


def test_top_on_a_terminal_shows_the_fleet_and_q_restores_the_screen(
    three: Three, tmp_path: Path
) -> None:
    """Every worker with its STATE (cordoned; ready in pool=a; ready), the long stream's
    worker in flight while it streams; q, and then Ctrl-C, quit with 0 and give the shell
    its screen and its terminal settings back (cooked: icanon, echo)."""
    fleet, daemon = three.fleet, three.daemon
    environ = {**fleet.ctl_env(daemon), "TERM": "xterm-256color"}
    top = shlex.join(dynamoctl("top"))
    tty = (
        "stty -a | tr ' ;' '\\n\\n' | grep -x -e icanon -e -icanon -e echo -e -echo | tr '\\n' ' '"
    )
    command = (
        f"trap 'echo SHELL-GOT-INT' INT; printf 'BEFORE-TOP\\n'; {top}; "
        f"printf 'TOP-EXIT=%s TTY=' $?; {tty}; echo END1; read again; {top}; "
        f"printf 'AGAIN-EXIT=%s TTY=' $?; {tty}; echo END2; sleep 600"
    )
    tmux = Tmux(tool("tmux"), tmp_path, command, environ)
    try:
        ids = [three.cordoned, three.pooled, three.long]
        screen = tmux.showing("INFLIGHT", *(i[:8] for i in ids))
        rows = rows_by_id(screen, ids)
        assert " cordoned " in rows[three.cordoned]
        assert " ready " in rows[three.pooled] and "pool=a" in rows[three.pooled]
        assert " ready " in rows[three.long] and "slot/long" in rows[three.long]
        assert "workers 3: 2 ready, 1 cordoned" in screen
        assert "split: pool=a 1/1, pool=b 0/0" in screen and "leader d1" in screen

        # Held open (the worker streams for a minute) until the screen shows it.
        with stream_request(daemon, "slot/long", max_tokens=4000):
            eventually_blocking(
                lambda: _in_flight(rows_by_id(tmux.screen(), [three.long])[three.long]),
                what="the long stream's worker in flight on the screen",
            )

        tmux.keys("q")
        after = tmux.showing("TOP-EXIT=", "END1")
        assert "TOP-EXIT=0 TTY=icanon echo END1" in after, after
        tmux.keys("Enter")  # top again, for Ctrl-C
        tmux.showing("INFLIGHT")
        tmux.keys("C-c")
        after = tmux.showing("AGAIN-EXIT=0 TTY=", "END2")
        assert "AGAIN-EXIT=0 TTY=icanon echo END2" in after, after
        assert "BEFORE-TOP" in after and "INFLIGHT" not in after
    finally:
        tmux.close()


def _in_flight(row: str) -> bool:
    """INFLIGHT (the sixth column) is 1 or more."""
    cells = row.split()
    return cells[5].isdigit() and int(cells[5]) >= 1


def test_once_prints_the_same_as_a_table_without_a_terminal(three: Three) -> None:
    """--once, and a piped stdout without it: the header and every worker's row."""
    fleet, daemon = three.fleet, three.daemon
    for args in (("top", "--once"), ("top",)):
        out = fleet.ctl(daemon, *args).stdout
        lines = out.splitlines()
        assert lines[0].startswith("dynamod d1 ") and "revision" in lines[0]
        assert lines[1] == "workers 3: 2 ready, 1 cordoned"
        assert lines[2].startswith("answers ") and "first byte p50" in lines[2]
        assert lines[3].startswith("pools split: pool=a 1/1, pool=b 0/0  leader d1 (epoch ")
        table = lines[5:]
        assert table[0].split() == [
            "ID", "MODEL", "STATE", "POOLS", "TAINTS", "INFLIGHT", "RUN", "WAIT", "KV", "RPS",
            "P50", "MARK",
        ]  # fmt: skip
        rows = rows_by_id(out, [three.cordoned, three.pooled, three.long])
        assert rows[three.cordoned].split()[2] == "cordoned"
        assert rows[three.pooled].split()[2:4] == ["ready", "pool=a"]
        assert rows[three.long].split()[2:5] == ["ready", "-", "slot/long"]
        assert len(table) == 4


def test_json_is_one_frame(three: Three) -> None:
    frame = json.loads(three.fleet.ctl(three.daemon, "top", "-o", "json", "--sort", "id").stdout)
    assert frame["workers"] == 3 and frame["states"] == {"cordoned": 1, "ready": 2}
    assert frame["interval_seconds"] > 0 and frame["leader"] == "d1"
    assert frame["pools"] == [
        {"policy": "split", "pool": "pool=a", "target": 1, "actual": 1},
        {"policy": "split", "pool": "pool=b", "target": 0, "actual": 0},
    ]
    assert [r["id"] for r in frame["rows"]] == sorted([three.cordoned, three.pooled, three.long])
    pooled = next(r for r in frame["rows"] if r["id"] == three.pooled)
    assert pooled["pools"] == ["pool=a"] and pooled["state"] == "ready"


def test_a_bad_selector_or_order_is_refused(three: Three) -> None:
    fleet, daemon = three.fleet, three.daemon
    bad = fleet.ctl(daemon, "top", "--once", "-l", "a,,b=", check=False)
    assert bad.returncode == 1 and "selector" in bad.stderr, bad.stderr
    order = fleet.ctl(daemon, "top", "--once", "--sort", "hotness", check=False)
    assert order.returncode == 2 and "--sort 'hotness' is not one of load, id" in order.stderr
