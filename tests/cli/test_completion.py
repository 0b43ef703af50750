"""Shell completion: the committed scripts load, the protocol they speak answers commands,
options and values, worker ids come from the daemon, and a daemon that is down or silent
gets an empty answer, quickly and without a word on stderr."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dynamoctl.shells import COMPLETION_TIMEOUT, TIMEOUT_VAR, completion_timeout
from tests.cli.conftest import Cli, Cluster, record, register_records, start_cluster
from tests.support.processes import BIN, ROOT

WORKERS = ("5eed0000aaaa0001", "5eed0000bbbb0002")


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("completion")
    register_records(
        (root / "store").as_uri(),
        [
            record(WORKERS[0], taints=["capacity/fast", "pool=a"]),
            record(WORKERS[1], model="mistral", taints=["pool=b"], port=8010),
        ],
    )
    started = start_cluster(root)
    # A Tab's deadline is 0.5 s; a test machine under load may need more for the answer
    # itself (what a silent daemon gets is the test below, at the default).
    started.cli.extra_env[TIMEOUT_VAR] = "30"
    try:
        yield started
    finally:
        started.stop()


def complete(cli: Cli, line: str, shell: str = "bash", **env: str) -> list[str]:
    """What dynamoctl answers a shell for ``line`` (the cursor at its end)."""
    words = line.split(" ")
    protocol = {
        "bash": {"COMP_WORDS": line, "COMP_CWORD": str(len(words) - 1)},
        "zsh": {"COMP_WORDS": line, "COMP_CWORD": str(len(words) - 1)},
        "fish": {"COMP_WORDS": line, "COMP_CWORD": words[-1]},
    }[shell]
    result = cli.run(env={"_DYNAMOCTL_COMPLETE": f"{shell}_complete", **protocol, **env})
    assert (result.code, result.err) == (0, "")
    return result.out.splitlines()


def values(answer: list[str]) -> list[str]:
    return [item.split(",", 1)[1] for item in answer if item]


def test_the_bash_script_loads_and_registers_the_function() -> None:
    script = ROOT / "completions" / "dynamoctl.bash"
    done = subprocess.run(
        ["bash", "-c", f"source {script}; complete -p dynamoctl"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "complete -o nosort -F _dynamoctl_completion dynamoctl"
    assert done.stderr == ""


def test_tab_in_bash_fills_compreply_through_the_script(seeded: Cluster) -> None:
    """The script and the program together, as bash runs them on Tab."""
    script = ROOT / "completions" / "dynamoctl.bash"
    tab = (
        f"source {script}; COMP_WORDS=(dynamoctl workers get 5eed); COMP_CWORD=3; "
        "_dynamoctl_completion dynamoctl; printf '%s\\n' \"${COMPREPLY[@]}\""
    )
    done = subprocess.run(
        ["bash", "-c", tab],
        capture_output=True,
        text=True,
        env=seeded.cli.env(PATH=f"{BIN}:/usr/bin:/bin"),
        check=True,
    )
    assert done.stdout.split() == list(WORKERS)


def test_the_committed_scripts_are_what_the_command_prints(tmp_path: Path) -> None:
    """No daemon needed: ``dynamoctl completion SHELL`` works anywhere."""
    cli = Cli(f"unix://{tmp_path / 'down.sock'}", tmp_path)
    for shell, name in (
        ("bash", "dynamoctl.bash"),
        ("zsh", "_dynamoctl"),
        ("fish", "dynamoctl.fish"),
    ):
        printed = cli.ok("completion", shell).out
        assert printed == (ROOT / "completions" / name).read_text()
    assert (ROOT / "completions" / "_dynamoctl").read_text().startswith("#compdef dynamoctl\n")


def test_commands_and_options_complete_from_the_tree(seeded: Cluster) -> None:
    cli = seeded.cli
    assert values(complete(cli, "dynamoctl ")) == [
        "workers", "taints", "events", "route", "pools", "status", "top", "config",
        "completion",
    ]  # fmt: skip
    assert values(complete(cli, "dynamoctl taints ")) == ["set", "add", "rm", "clear"]
    assert "--if-revision" in values(complete(cli, "dynamoctl taints add --"))
    assert values(complete(cli, "dynamoctl -o ")) == ["table", "wide", "json", "yaml", "name"]
    assert values(complete(cli, "dynamoctl workers ls -o j")) == ["json"]


def test_worker_ids_taints_and_models_come_from_the_daemon(seeded: Cluster) -> None:
    cli = seeded.cli
    assert values(complete(cli, "dynamoctl workers get ")) == list(WORKERS)
    assert values(complete(cli, "dynamoctl taints add 5eed0000b")) == [WORKERS[1]]
    # rm offers what that worker holds, add what other workers hold and it lacks
    assert values(complete(cli, f"dynamoctl taints rm {WORKERS[0]} ")) == [
        "capacity/fast",
        "pool=a",
    ]
    assert values(complete(cli, f"dynamoctl taints add {WORKERS[1]} ")) == [
        "capacity/fast",
        "pool=a",
    ]
    assert values(complete(cli, f"dynamoctl taints rm {WORKERS[0]} --key ")) == [
        "capacity/fast",
        "pool",
    ]
    assert values(complete(cli, "dynamoctl workers ls --model m")) == ["mistral"]
    assert values(complete(cli, "dynamoctl workers ls -l pool=a,!c")) == ["pool=a,!capacity/fast"]


def test_zsh_and_fish_answers_carry_descriptions(seeded: Cluster) -> None:
    zsh = complete(seeded.cli, "dynamoctl workers get 5eed0000a", "zsh")
    assert zsh == ["plain", WORKERS[0], "llama capacity/fast,pool=a"]
    fish = complete(seeded.cli, "dynamoctl workers get 5eed0000a", "fish")
    assert fish == [f"plain,{WORKERS[0]}\tllama capacity/fast,pool=a"]


def test_paths_complete_as_files(seeded: Cluster) -> None:
    assert complete(seeded.cli, "dynamoctl --token-file /et") == ["file,/et"]


def test_a_daemon_that_is_down_gets_an_empty_answer(tmp_path: Path) -> None:
    cli = Cli(f"unix://{tmp_path / 'down.sock'}", tmp_path)
    assert complete(cli, "dynamoctl workers get ") == []


def test_a_silent_daemon_gets_an_empty_answer_within_the_completion_deadline(
    tmp_path: Path,
) -> None:
    """A listener that never answers: only the completion deadline (0.5 s) ends the wait.

    The command's own deadline is set to an hour, past the 60 s the test's run waits for
    the process: a Tab that waited on it instead would fail the run, not pass slowly."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        cli = Cli(f"127.0.0.1:{server.getsockname()[1]}", tmp_path)
        assert complete(cli, "dynamoctl workers get ", DYNAMO_TIMEOUT="3600") == []


def test_completion_needs_no_daemon_for_commands_even_when_one_is_configured(
    tmp_path: Path,
) -> None:
    cli = Cli("127.0.0.1:9", tmp_path)
    assert "status" in values(complete(cli, "dynamoctl st"))


@pytest.mark.parametrize(
    ("given", "seconds"),
    [(None, COMPLETION_TIMEOUT), ("2.5", 2.5)]
    + [(bad, COMPLETION_TIMEOUT) for bad in ("0", "-1", "nan", "inf", "soon", "")],
)
def test_the_completion_deadline_comes_from_the_environment_when_it_is_one(
    given: str | None, seconds: float
) -> None:
    assert completion_timeout({} if given is None else {TIMEOUT_VAR: given}) == seconds
