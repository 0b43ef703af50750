"""The pool leader's settings, refused before anything starts (issues 27 and 29):
``pool_lease_ttl`` under twice the store call deadline (the fence's margin), and a
``dynamo+`` state store (read only) — by ``dynamod check-config`` and by a start alike, with
exit 78 naming the values and the rule; and the ``--state-store`` flag."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dynamod import settings as daemon_settings
from dynamod.errors import ConfigError
from tests.support.processes import BIN, env

EX_CONFIG = 78


def dynamod(tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in env().items() if not k.startswith("DYNAMO")}
    argv = [
        str(BIN / "dynamod"), "--store", (tmp_path / "store").as_uri(),
        "--audit-log", str(tmp_path / "audit.log"),
        "--listen", f"unix://{tmp_path / 'd.sock'}", "--http", "127.0.0.1:0", *args,
    ]  # fmt: skip
    return subprocess.run(
        argv, capture_output=True, text=True, env={**base, **extra}, timeout=60, check=False
    )


@pytest.mark.parametrize("command", [("check-config",), ()], ids=["check-config", "start"])
def test_a_lease_under_twice_the_store_deadline_is_refused(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    refused = dynamod(tmp_path, *command, DYNAMO_POOL_LEASE_TTL="1")
    assert refused.returncode == EX_CONFIG, refused.stderr
    assert "pool_lease_ttl (1 s) must be at least 2 times store_timeout (5 s)" in refused.stderr
    assert "a write that passed its fence" in refused.stderr
    assert not (tmp_path / "d.sock").exists()


def test_the_margin_holds_either_way_and_a_shorter_deadline_allows_a_shorter_lease() -> None:
    with pytest.raises(ConfigError, match=r"pool_lease_ttl \(9\.5 s\)"):
        daemon_settings.load(environ={"DYNAMO_POOL_LEASE_TTL": "9.5"})
    settings = daemon_settings.load(environ={"DYNAMO_POOL_LEASE_TTL": "10"})
    assert (settings.pool_lease_ttl, settings.store_timeout) == (10.0, 5.0)
    environ = {"DYNAMO_POOL_LEASE_TTL": "2", "DYNAMO_STORE_TIMEOUT": "1"}
    assert daemon_settings.load(environ=environ).store_timeout == 1.0
    with pytest.raises(ConfigError, match=r"store_timeout must be 0\.1 to 600 seconds"):
        daemon_settings.load(environ={"DYNAMO_STORE_TIMEOUT": "0"})


def test_check_config_refuses_a_dynamo_state_store(tmp_path: Path) -> None:
    refused = dynamod(tmp_path, "check-config", DYNAMO_STATE_STORE="dynamo+etcd://127.0.0.1:2379")
    assert refused.returncode == EX_CONFIG, refused.stderr
    assert "state_store 'dynamo+etcd://127.0.0.1:2379'" in refused.stderr
    assert "DYNAMO_STATE_STORE" in refused.stderr


def test_the_state_store_flag(tmp_path: Path) -> None:
    state = (tmp_path / "state").as_uri()
    checked = dynamod(tmp_path, "--state-store", state, "check-config")
    assert checked.returncode == 0, checked.stderr
    assert f"state_store = {state!r}" in checked.stdout
    refused = dynamod(tmp_path, "--state-store", "dynamo+file:///x", "check-config")
    assert refused.returncode == EX_CONFIG
