"""The systemd unit and the example config are valid as shipped."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dynamod import settings as daemon_settings
from dynamod.open_files import RESERVE
from tests.support.processes import BIN, ROOT

UNIT = ROOT / "packaging" / "systemd" / "dynamod.service"


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)
def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    unit = tmp_path / "dynamod.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/dynamod", str(BIN / "dynamod")))
    manpath = tmp_path / "man"  # as the wheel installs them: share/man/man<section>/
    for page in (ROOT / "man").glob("*.[0-9]"):
        section = manpath / f"man{page.suffix[1:]}"
        section.mkdir(parents=True, exist_ok=True)
        shutil.copy(page, section / page.name)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)],
        capture_output=True,
        text=True,
        env={**os.environ, "MANPATH": str(manpath)},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


def test_unit_keeps_stop_timeout_above_the_default_grace() -> None:
    text = UNIT.read_text()
    stop = int(
        next(line for line in text.splitlines() if line.startswith("TimeoutStopSec=")).split("=")[1]
    )
    settings = daemon_settings.load(
        path=ROOT / "packaging" / "systemd" / "dynamod.toml", environ={}
    )
    assert stop > settings.grace + settings.drain
    assert "Type=notify" in text
    assert "ExecReload=" in text
    assert "WatchdogSec=" in text


def test_example_config_loads() -> None:
    settings = daemon_settings.load(
        path=ROOT / "packaging" / "systemd" / "dynamod.toml", environ={}
    )
    assert settings.store == "etcd://127.0.0.1:2379/dynamo"
    assert settings.router.max_queue == 1024


def test_unit_lets_the_daemon_follow_a_fleet_of_10_000_streams() -> None:
    """systemd's default soft limit (1,024 open files) runs out near 1,000 followed workers:
    the unit sets its own, room for 10,000 streams beside the daemon's reserve."""
    lines = UNIT.read_text().splitlines()
    limit = int(next(line for line in lines if line.startswith("LimitNOFILE=")).split("=")[1])
    assert limit >= 10_000 + RESERVE
