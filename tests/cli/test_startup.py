"""Start-up is a feature: shell completion runs dynamoctl on every Tab. ``--help`` and
completion of commands and options import neither gRPC nor rich (nor pydantic, which typer
would pull in to convert parameters); piped output never imports rich; ``workers ls`` and
``taints add``, which scripts run in loops, import neither typer nor click (``direct``),
nor the selector grammar when no selector is given."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import Cluster, clean_env
from tests.support.processes import ROOT

HEAVY = ("grpc", "rich", "pydantic")


def imported(args: list[str], home: Path, *, full: bool = False, **env: str) -> set[str]:
    """Top-level packages ``python -X importtime -m dynamoctl.main ARGS`` imported (with
    ``full``, every module by its dotted name)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "dynamoctl.main", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=clean_env(home, **env),
        timeout=60,
        check=False,
    )
    names = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            names.add(name if full else name.split(".")[0])
    assert names, f"no -X importtime output:\n{done.stderr}"
    return names


@pytest.mark.parametrize(
    "args", [["--help"], ["workers", "--help"], ["taints", "add", "--help"], ["--version"]]
)
def test_help_imports_no_grpc_no_rich(args: list[str], tmp_path: Path) -> None:
    assert not imported(args, tmp_path) & set(HEAVY)


def test_completion_of_commands_and_options_imports_no_grpc_no_rich(tmp_path: Path) -> None:
    # -X importtime writes to stderr, which completion silences; so ask for a script, which
    # goes through the same start-up, and check a real completion separately below.
    assert not imported(["completion", "bash"], tmp_path) & set(HEAVY)


def test_a_completion_answer_loads_no_heavy_module(tmp_path: Path) -> None:
    probe = (
        "import os, sys\n"
        "os.environ.update(_DYNAMOCTL_COMPLETE='bash_complete',"
        " COMP_WORDS='dynamoctl workers ls -o ', COMP_CWORD='4')\n"
        "from dynamoctl.main import main\n"
        "main([])\n"
        "sys.stdout.write('LOADED ' + ' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=clean_env(tmp_path),
        timeout=60,
        check=True,
    )
    answer, loaded = done.stdout.split("LOADED ")
    assert answer.split() == ["plain,table", "plain,wide", "plain,json", "plain,yaml", "plain,name"]
    assert not set(loaded.split()) & set(HEAVY)


def test_piped_output_does_not_import_rich(cluster: Cluster) -> None:
    loaded = imported(["events", "tail", "--no-follow"], cluster.cli.home,
                      DYNAMO_ENDPOINT=cluster.cli.endpoint)  # fmt: skip
    assert "grpc" in loaded  # it did talk to the daemon
    assert not loaded & {"rich", "pydantic"}


@pytest.mark.parametrize(
    "args", [["workers", "ls"], ["workers", "ls", "-o", "json"], ["taints", "add", "nobody", "a/b"]]
)
def test_the_commands_scripts_loop_on_import_no_typer(cluster: Cluster, args: list[str]) -> None:
    """Nor gRPC, nor asyncio: the light client (``dynamod.client.light``) talks to the
    daemon, with no event loop; nor the reports and KV events a listing never shows."""
    loaded = imported(args, cluster.cli.home, full=True, DYNAMO_ENDPOINT=cluster.cli.endpoint)
    assert "dynamod.client.http2" in loaded  # it did talk to the daemon
    top = {name.split(".")[0] for name in loaded}
    assert not top & {"typer", "click", "rich", "pydantic", "grpc", "asyncio"}
    assert not loaded & {"dynamod.selectors", "dynamod.reports", "dynamod.kv_events"}
