"""dynamod settings: layers, precedence and refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamod import settings as daemon_settings
from dynamod.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "dynamod.toml"
    path.write_text(text)
    return path


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    path = write(
        tmp_path, 'store = "memory://"\nlog_level = "debug"\ngrace = 5\n[router]\nmax_queue = 7\n'
    )
    settings = daemon_settings.load(path=path, environ={})
    assert (settings.store, settings.log_level, settings.grace) == ("memory://", "debug", 5.0)
    assert settings.router.max_queue == 7
    environ = {"DYNAMO_LOG_LEVEL": "WARNING", "DYNAMO_ROUTER_MAX_QUEUE": "9", "DYNAMO_GRACE": "6"}
    settings = daemon_settings.load(path=path, environ=environ)
    assert (settings.log_level, settings.router.max_queue, settings.grace) == ("warning", 9, 6.0)
    settings = daemon_settings.load(
        path=path, environ=environ, flags={"grace": 1.5, "log_level": None}
    )
    assert (settings.grace, settings.log_level) == (1.5, "warning")


def test_config_file_comes_from_the_environment(tmp_path: Path) -> None:
    path = write(tmp_path, 'replica_id = "from-file"\n')
    assert daemon_settings.load(environ={"DYNAMO_CONFIG": str(path)}).replica_id == "from-file"


def test_listen_accepts_a_comma_separated_environment_value(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    environ = {
        "DYNAMO_LISTEN": f"unix://{tmp_path}/a.sock, 127.0.0.1:7070",
        "DYNAMO_TOKENS_FILE": str(tokens),
    }
    settings = daemon_settings.load(environ=environ, path=write(tmp_path, ""))
    assert settings.listen == (f"unix://{tmp_path}/a.sock", "127.0.0.1:7070")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('stroe = "x"', "unknown setting 'stroe'"),
        ("[router]\nmax_queu = 1", "unknown router setting 'max_queu'"),
        ('grace = "soon"', "grace: expected a float, got 'soon'"),
        ("grace = -1", "grace must be a number of seconds >= 0, got -1.0"),
        (
            "model_gone_window = -1",
            "model_gone_window must be a number of seconds >= 0, got -1.0",
        ),
        ('log_level = "loud"', "log_level 'loud' is not one of debug, info, warning, error"),
        ('listen = ["0.0.0.0:7070"]', "is TCP: set tokens_file or tls_client_ca (mTLS)"),
        ('listen = ["unix://relative.sock"]', "needs an absolute path"),
        ('http = "8080"', "http '8080' must look like HOST:PORT"),
        ('tls_cert = "/c"', "tls_cert and tls_key must be set together"),
        ("[router]\ntemperature = -1", "temperature"),
        ("not toml =", "is not valid TOML"),
        ("memory_budget_mb = 0", "memory_budget_mb must be a number of MiB above 0, got 0.0"),
        (
            "memory_budget_mb = 200\ntokenizer_bundle_max_mb = 128",
            "memory_budget_mb (200) must be at least twice tokenizer_bundle_max_mb (128)",
        ),
    ],
)
def test_bad_settings_are_refused_by_name(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        daemon_settings.load(path=write(tmp_path, text), environ={})
    assert message in str(caught.value)


def test_missing_config_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        daemon_settings.load(path=tmp_path / "absent.toml", environ={})


def test_the_memory_budget_comes_from_the_environment(tmp_path: Path) -> None:
    environ = {"DYNAMO_MEMORY_BUDGET_MB": "1024"}
    settings = daemon_settings.load(environ=environ, path=write(tmp_path, ""))
    assert settings.memory_budget == 1024 << 20
    assert daemon_settings.load(environ={}, path=write(tmp_path, "")).memory_budget == 512 << 20
