"""``--help``, ``--version`` and Tab completion of names, answered without typer from the
command tree's snapshot (``dynamoctl.fastpath``), must say exactly what the live CLI says.

Every command's help is compared, at each width the snapshot holds and at one it does not,
with what dynamoctl prints when a config file sends it down the live path; completion is
compared in process, shell by shell, at every command path for a corpus of words typed.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamoctl import fastpath, shells
from dynamoctl.app import command
from dynamoctl.generated import names
from tests.cli.conftest import clean_env
from tests.support.processes import ROOT, dynamoctl

PATHS = sorted(names.OPTIONS, key=lambda p: (p.count(" "), p))
TYPED = ["", "w", "wor", "t", "x", "-", "--", "-o", "--o", "--no", "--help", "+", "=", "-e="]


def run(args: list[str], home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        dynamoctl(*args), capture_output=True, text=True, env=clean_env(home, **env),
        cwd=ROOT, timeout=60, check=False,
    )  # fmt: skip


def python(code: str, home: Path) -> str:
    """What ``python -c code`` prints, in dynamoctl's isolated environment."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
        env=clean_env(home), timeout=60, check=True,
    )  # fmt: skip
    return done.stdout


@pytest.mark.parametrize("columns", ["80", "120", "90"])
def test_every_help_is_what_the_live_cli_prints(tmp_path: Path, columns: str) -> None:
    """With a config file (empty: no defaults change), dynamoctl takes the live path."""
    live_home = tmp_path / "live"
    (live_home / ".config" / "dynamoctl").mkdir(parents=True)
    (live_home / ".config" / "dynamoctl" / "config.toml").write_text("")
    for path in PATHS:
        for flag in ("--help", "-h"):
            args = [*path.split(), flag]
            fast, live = run(args, tmp_path, COLUMNS=columns), run(args, live_home, COLUMNS=columns)
            assert (fast.returncode, fast.stdout, fast.stderr) == (0, live.stdout, ""), args


def test_help_and_tab_import_neither_typer_nor_click(tmp_path: Path) -> None:
    probe = (
        "import os, sys\n"
        "from dynamoctl.main import main\n"
        "assert main(['workers', 'ls', '--help']) == 0\n"
        "os.environ.update(_DYNAMOCTL_COMPLETE='bash_complete', COMP_WORDS='dynamoctl wor',"
        " COMP_CWORD='1')\n"
        "assert main([]) == 0\n"
        "sys.stdout.write('LOADED ' + ' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    output, loaded = python(probe, tmp_path).split("LOADED ")
    assert output.startswith("Usage: dynamoctl workers ls [OPTIONS]")
    assert output.endswith("plain,workers\n")
    assert not set(loaded.split()) & {"typer", "click", "grpc", "rich", "pydantic", "typing"}


def test_the_version_is_the_live_one(tmp_path: Path) -> None:
    assert run(["--version"], tmp_path).stdout == "dynamoctl 0.1.0\n"


@pytest.fixture(scope="module")
def cli() -> Any:
    from dynamoctl import coercion

    coercion.install()
    return command()


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for name in ("COMP_WORDS", "COMP_CWORD", fastpath.COMPLETE_VAR):
            patch.delenv(name, raising=False)
        for name, value in values.items():
            patch.setenv(name, value)
        yield


Answer = tuple[list[str], list[str]]


def both(cli: Any, shell: str, words: str, cword: str) -> tuple[Answer | None, Answer]:
    """(the fast path's answer, or None where it declines; the live CLI's answer)."""
    env = {"COMP_WORDS": words, "COMP_CWORD": cword, fastpath.COMPLETE_VAR: f"{shell}_complete"}
    with environment(**env):
        live = shells.SHELLS[shell](cli, {"default_map": {}}, "dynamoctl", "x").complete()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = fastpath.answer([], env)
    if code is None:
        return None, canonical(shell, live)
    return canonical(shell, out.getvalue()), canonical(shell, live + "\n" if live else "")


def canonical(shell: str, answer: str) -> tuple[list[str], list[str]]:
    """The answer's items in order, but the help option's two names apart and sorted: click
    offers them in the order of a set, which changes from run to run."""
    lines = answer.splitlines()
    size = 3 if shell == "zsh" else 1
    items = ["\n".join(lines[i : i + size]) for i in range(0, len(lines), size)]
    helps = [i for i in items if value_of(shell, i) in fastpath.HELP_FLAGS]
    return [i for i in items if i not in helps], sorted(helps)


def value_of(shell: str, item: str) -> str:
    if shell == "zsh":
        return item.split("\n")[1]
    return item.split(",", 1)[1].split("\t")[0]


def cases(shell: str, path: str, typed: str) -> tuple[str, str]:
    words = f"dynamoctl {path} {typed}".replace("  ", " ")
    if shell == "fish":
        return words, typed
    return words, str(len(f"{path} ".split()) if path else 1)


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_tab_on_names_answers_as_the_live_cli_at_every_command_path(
    cli: object, shell: str
) -> None:
    answered = 0
    for path in PATHS:
        for typed in TYPED:
            fast, live = both(cli, shell, *cases(shell, path, typed))
            if fast is not None:
                answered += 1
                assert fast == live, (shell, path, typed)
    assert answered > len(PATHS) * len(TYPED) // 2  # it does answer most of them


@settings(max_examples=300, deadline=None)
@given(
    path=st.sampled_from(PATHS),
    typed=st.text(alphabet="-=aeiklmnorstw+x", max_size=6),
    shell=st.sampled_from(["bash", "zsh", "fish"]),
)
def test_tab_on_any_word_answers_as_the_live_cli_or_leaves_it_to_it(
    cli: Any, path: str, typed: str, shell: str
) -> None:
    fast, live = both(cli, shell, *cases(shell, path, typed))
    assert fast is None or fast == live


@pytest.mark.parametrize(
    ("words", "cword"),
    [
        ("dynamoctl workers ls -o ", "4"),  # an option's value
        ("dynamoctl workers get ", "3"),  # an argument: worker ids come from the daemon
        ("dynamoctl -e x wor", "3"),  # an option before the command
        ("dynamoctl 'wor", "1"),  # quoting
        ("dynamoctl --endpoint=", "1"),
    ],
)
def test_the_fast_path_leaves_values_arguments_and_quoting_to_the_live_cli(
    words: str, cword: str
) -> None:
    env = {"COMP_WORDS": words, "COMP_CWORD": cword, fastpath.COMPLETE_VAR: "bash_complete"}
    assert fastpath.answer([], env) is None


@pytest.mark.parametrize(
    ("argv", "found"),
    [
        (["workers", "ls"], "workers"),
        (["-o", "json", "workers", "ls"], "workers"),
        (["--endpoint=/run/x.sock", "--tls", "taints", "add", "a", "b"], "taints"),
        (["-e", "workers", "status"], "status"),  # -e takes "workers" as its value
        (["--bogus", "workers", "ls"], None),  # an option the root does not know
        (["wrokers", "ls"], None),  # no such command: click will say so, with a suggestion
        ([], None),
        (["--debug"], None),
    ],
)
def test_the_command_on_the_line_is_found_or_the_whole_tree_is_built(
    argv: list[str], found: str | None
) -> None:
    from dynamoctl.app import invoked

    assert invoked(argv) == found


def test_running_one_command_builds_and_imports_only_that_one(tmp_path: Path) -> None:
    probe = (
        "import sys\n"
        "from dynamoctl.app import command, invoked\n"
        "cli = command(invoked(['-o', 'json', 'status']))\n"
        "assert list(cli.commands) == ['status']\n"
        "sys.stdout.write(' '.join(sorted(m for m in sys.modules if m.startswith('dynamoctl'))))\n"
    )
    loaded = python(probe, tmp_path).split()
    assert "dynamoctl.commands.status" in loaded
    assert "dynamoctl.commands.workers" not in loaded
