"""Exit statuses and error lines that need no daemon: usage errors (2), an unreachable
daemon (3, naming the endpoint), the config file and its precedence, credentials files."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.conftest import Cli, on_terminal


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(f"unix://{tmp_path / 'nobody.sock'}", tmp_path / "home")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["frobnicate"], "No such command 'frobnicate'"),
        (["workers", "ls", "--bogus"], "No such option: --bogus"),
        (["workers", "get"], "Missing argument 'ID'"),
        (["-o", "xml", "workers", "ls"], "'xml' is not one of table, wide, json, yaml, name"),
        (["workers", "ls", "-o", "xml"], "'xml' is not one of table, wide, json, yaml, name"),
        (["status", "-o", "name"], "'name' is not supported by 'dynamoctl status'"),
        (["--timeout", "0", "status"], "0.0 is not a number of seconds above 0"),
        (["--timeout", "soon", "status"], "'soon' is not a number"),
        (["taints", "add", "-l", "a", "--all", "x"], "exactly one of ID, -l SELECTOR or --all"),
        (["route", "explain", "--model", "m", "--prefer", "fast"], "must look like TAINT=WEIGHT"),
        (["completion", "tcsh"], "'tcsh' is not one of bash, zsh, fish"),
        (["taints", "add", "a", "x", "--if-revision", "-1"], "-1 is not a store revision"),
        (["workers", "ls", "-o", "jsonpath={.id"], "unbalanced brace"),
    ],
)
def test_usage_errors_exit_2_with_a_hint(cli: Cli, args: list[str], says: str) -> None:
    result = cli.run(*args)
    assert result.code == 2, result.err
    assert result.out == ""
    assert says in result.err
    assert "Try 'dynamoctl" in result.err  # click's pointer to --help


def test_no_arguments_prints_help(cli: Cli) -> None:
    result = cli.run()
    assert "Usage: dynamoctl [OPTIONS] COMMAND [ARGS]..." in result.out + result.err


def test_unreachable_daemon_exits_3_and_names_the_endpoint(cli: Cli) -> None:
    for args in (["workers", "ls"], ["status"], ["events", "tail"], ["taints", "add", "a", "b"]):
        result = cli.run(*args)
        assert result.code == 3
        (line,) = result.err.splitlines()
        assert line.startswith(f"dynamoctl: error: cannot reach dynamod at {cli.endpoint}")
        assert "--endpoint or DYNAMO_ENDPOINT" in line


def test_debug_adds_the_traceback(cli: Cli) -> None:
    result = cli.run("--debug", "status", clean=False)
    assert result.code == 3
    assert "Traceback" in result.err and "UnreachableError" in result.err


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A TCP port that accepts connections and never answers: only a deadline ends a call."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.listen(16)
        yield f"127.0.0.1:{server.getsockname()[1]}"


def test_timeout_bounds_a_call_to_a_silent_daemon(cli: Cli, silent_server: str) -> None:
    started = time.monotonic()
    result = cli.run("--timeout", "0.5", "workers", "ls", env={"DYNAMO_ENDPOINT": silent_server})
    assert result.code == 3
    assert silent_server in result.err
    assert time.monotonic() - started < 20  # the deadline, not a hang (generous: start-up)


def write_config(cli: Cli, text: str) -> Path:
    path = cli.home / ".config" / "dynamoctl" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def tried(cli: Cli, *args: str, **env: str) -> str:
    """The endpoint dynamoctl dialled, from its unreachable message."""
    result = cli.run(*args, "status", env=env)
    assert result.code == 3, result.err
    return result.err.split("cannot reach dynamod at ", 1)[1].split(" ", 1)[0]


def test_flags_beat_environment_beat_config_file(cli: Cli, tmp_path: Path) -> None:
    write_config(cli, f'endpoint = "unix://{tmp_path}/file.sock"\n')
    env = f"unix://{tmp_path}/env.sock"
    flag = f"unix://{tmp_path}/flag.sock"
    assert tried(cli, DYNAMO_ENDPOINT="") == f"unix://{tmp_path}/file.sock"
    assert tried(cli, DYNAMO_ENDPOINT=env) == env
    assert tried(cli, "--endpoint", flag, DYNAMO_ENDPOINT=env) == flag


def test_the_config_file_sets_the_output_format(cli: Cli) -> None:
    write_config(cli, 'output = "xml"\n')
    result = cli.run("status")
    assert result.code == 2 and "'xml' is not one of" in result.err


def test_xdg_config_home_and_dynamoctl_config_choose_the_file(cli: Cli, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    (other / "dynamoctl").mkdir(parents=True)
    (other / "dynamoctl" / "config.toml").write_text('endpoint = "unix:///xdg.sock"\n')
    assert tried(cli, DYNAMO_ENDPOINT="", XDG_CONFIG_HOME=str(other)) == "unix:///xdg.sock"
    named = tmp_path / "named.toml"
    named.write_text('endpoint = "unix:///named.sock"\n')
    assert tried(cli, DYNAMO_ENDPOINT="", DYNAMOCTL_CONFIG=str(named)) == "unix:///named.sock"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("endpiont = 'x'\n", "has unknown key 'endpiont'; known keys are endpoint, token_file"),
        ("endpoint = \n", "is not valid TOML"),
    ],
)
def test_a_broken_config_file_is_a_usage_error_naming_it(cli: Cli, text: str, says: str) -> None:
    path = write_config(cli, text)
    result = cli.run("workers", "ls")
    assert result.code == 2
    assert result.err.startswith(f"dynamoctl: error: config file '{path}'")
    assert says in result.err


def test_unreadable_credentials_are_named(cli: Cli, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-token"
    result = cli.run("--token-file", str(missing), "status")
    assert result.code == 2
    assert result.err == (
        f"dynamoctl: error: --token-file '{missing}' cannot be read: No such file or directory\n"
    )
    half = cli.run("--cert", str(missing), "status")
    assert half.code == 2 and "--cert and --cert-key must be given together" in half.err


def test_errors_are_red_on_a_terminal_unless_no_color(cli: Cli) -> None:
    code, shown = on_terminal(cli, "status")
    assert code == 3
    assert "\x1b[" in shown and "dynamoctl: error:" in shown
    code, plain = on_terminal(cli, "status", NO_COLOR="1")
    assert code == 3
    assert "\x1b[" not in plain and plain.startswith("dynamoctl: error: cannot reach dynamod")
