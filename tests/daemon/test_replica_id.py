"""The default replica id is stable: the host name and a suffix kept beside the audit log,
so a restarted dynamod has the name its audit lines (``pools@<replica>``) were written
under. Two starts of a real dynamod give one id; ``--replica-id`` still wins; another
audit log, another id; a file that holds no suffix is refused naming it."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

from dynamod import settings as daemon_settings
from dynamod.errors import ConfigError
from dynamod.settings.replica import BESIDE_AUDIT_LOG
from tests.support.processes import BIN, daemon_argv, env, started

HOST = socket.gethostname()


def start(root: Path, *args: str) -> str:
    """Start dynamod on a file store under ``root`` and stop it; its ready line's replica."""
    daemon = started(
        daemon_argv((root / "store").as_uri(), root / "d.sock", *args),
        r"^dynamod ready:",
        root / "dynamod.log",
    )
    try:
        return daemon.field("replica")
    finally:
        assert daemon.stop() == 0


def test_two_starts_of_one_daemon_have_one_replica_id(tmp_path: Path) -> None:
    first = start(tmp_path)
    assert start(tmp_path) == first
    suffix = (tmp_path / f"audit.log{BESIDE_AUDIT_LOG}").read_text().strip()
    assert first == f"{HOST}-{suffix}"
    assert re.fullmatch(r"[0-9a-f]{8}", suffix)


def test_the_replica_id_flag_wins_and_writes_nothing(tmp_path: Path) -> None:
    assert start(tmp_path, "--replica-id", "named-one") == "named-one"
    assert not (tmp_path / f"audit.log{BESIDE_AUDIT_LOG}").exists()


def test_daemons_with_their_own_audit_logs_have_their_own_ids(tmp_path: Path) -> None:
    a = daemon_settings.load(environ={}, flags={"audit_log": tmp_path / "a" / "audit.log"})
    b = daemon_settings.load(environ={}, flags={"audit_log": tmp_path / "b" / "audit.log"})
    assert a.replica_id != b.replica_id
    assert {a.replica_id.rpartition("-")[0], b.replica_id.rpartition("-")[0]} == {HOST}
    again = daemon_settings.load(environ={}, flags={"audit_log": tmp_path / "a" / "audit.log"})
    assert again.replica_id == a.replica_id


def test_without_an_audit_log_the_id_is_host_and_pid_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two daemons without an audit log on one host share no file of their own: a kept
    suffix would give them one id."""
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))
    settings = daemon_settings.load(environ={"DYNAMO_AUDIT_LOG": ""})
    assert settings.audit_log is None
    assert settings.replica_id == f"{HOST}-{os.getpid()}"
    assert list(tmp_path.iterdir()) == []


def test_where_no_file_can_be_made_the_id_is_host_and_pid(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory\n")
    settings = daemon_settings.load(environ={}, flags={"audit_log": blocked / "audit.log"})
    host, _, pid = settings.replica_id.rpartition("-")
    assert (host, pid.isdigit()) == (HOST, True)


@pytest.mark.parametrize("text", ["", "two words\n", "x" * 65, "é\n"])
def test_a_file_holding_no_suffix_is_refused_naming_it(tmp_path: Path, text: str) -> None:
    (tmp_path / f"audit.log{BESIDE_AUDIT_LOG}").write_text(text)
    with pytest.raises(ConfigError, match=r"audit\.log\.replica-id' holds .*, not a suffix"):
        daemon_settings.load(environ={}, flags={"audit_log": tmp_path / "audit.log"})


def test_check_config_refuses_a_bad_suffix_file_with_exit_78(tmp_path: Path) -> None:
    audit = tmp_path / "audit.log"
    (tmp_path / f"audit.log{BESIDE_AUDIT_LOG}").write_text("two words\n")
    done = subprocess.run(
        [str(BIN / "dynamod"), "--audit-log", str(audit), "--store",
         (tmp_path / "store").as_uri(), "--listen", f"unix://{tmp_path}/d.sock", "check-config"],
        capture_output=True, text=True, env=env(), timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 78, done.stderr
    assert "replica-id' holds 'two words', not a suffix" in done.stderr
