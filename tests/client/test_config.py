"""Where the client finds the daemon and its credentials: the same places, in the same
order, as dynamoctl (arguments > environment > config file > defaults)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamoctl import fastpath
from dynamoctl.options import FIELDS
from dynamod.client.endpoint import (
    CONFIG_KEYS,
    DEFAULT_TIMEOUT,
    ENVIRONMENT,
    Credentials,
    config_path,
    default_endpoint,
    resolve,
)
from dynamod.errors import ConfigError


def test_the_client_and_dynamoctl_know_the_same_keys_variables_and_file() -> None:
    assert set(CONFIG_KEYS) == set(FIELDS) - {"debug", "context"}  # it chooses the keys
    assert set(ENVIRONMENT.values()) == {
        "DYNAMO_ENDPOINT", "DYNAMO_TOKEN_FILE", "DYNAMO_TLS", "DYNAMO_CACERT", "DYNAMO_CERT",
        "DYNAMO_CERT_KEY", "DYNAMO_TIMEOUT",
    }  # fmt: skip
    for environ in (
        {},
        {"XDG_CONFIG_HOME": "/etc/xdg"},
        {"DYNAMOCTL_CONFIG": "~/elsewhere.toml", "XDG_CONFIG_HOME": "/etc/xdg"},
    ):
        assert config_path(environ) == fastpath.config_path(environ)


def write(home: Path, text: str) -> dict[str, str]:
    (home / "dynamoctl").mkdir(parents=True, exist_ok=True)
    (home / "dynamoctl" / "config.toml").write_text(text)
    return {"XDG_CONFIG_HOME": str(home)}


def test_arguments_beat_the_environment_beat_the_file_beat_the_defaults(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    environ = write(tmp_path, f'endpoint = "file:9"\ntoken_file = "{token}"\ntimeout = 3\n')
    from_file = resolve(environ=environ)
    assert (from_file.endpoint, from_file.timeout) == ("file:9", 3.0)
    assert from_file.credentials == Credentials(token="s3cret-token")
    environ |= {"DYNAMO_ENDPOINT": "env:8", "DYNAMO_TLS": "yes", "DYNAMO_TIMEOUT": "4.5"}
    from_env = resolve(environ=environ)
    assert (from_env.endpoint, from_env.timeout, from_env.credentials.tls) == ("env:8", 4.5, True)
    given = resolve("arg:7", tls=False, timeout=1, environ=environ)
    assert (given.endpoint, given.timeout, given.credentials.tls) == ("arg:7", 1.0, False)
    bare = resolve(environ={"XDG_CONFIG_HOME": str(tmp_path / "none")})
    assert (bare.endpoint, bare.timeout, bare.credentials) == (
        default_endpoint(), DEFAULT_TIMEOUT, Credentials()
    )  # fmt: skip


@pytest.mark.parametrize(
    ("text", "environ", "message"),
    [
        ('endpont = "x"\n', {}, "has unknown key 'endpont'; known keys are endpoint"),
        ("endpoint = \n", {}, "is not valid TOML"),
        ("", {"DYNAMO_TLS": "maybe"}, "DYNAMO_TLS='maybe' is not a boolean"),
        ("", {"DYNAMO_TIMEOUT": "soon"}, "DYNAMO_TIMEOUT='soon' is not a number of seconds"),
        ("", {"DYNAMO_TIMEOUT": "0"}, "timeout 0 is not a number of seconds above 0"),
        ('cert = "/x.pem"\n', {}, "--cert and --cert-key must be given together"),
        ('token_file = "/nonexistent/token"\n', {}, "--token-file '/nonexistent/token' cannot"),
    ],
)
def test_bad_settings_are_refused_naming_them(
    tmp_path: Path, text: str, environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        resolve(environ=write(tmp_path, text) | environ)
