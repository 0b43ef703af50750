"""Contexts in the config file, as kubectl keeps several clusters: ``[contexts.NAME]``
tables, ``current_context``, ``--context`` for one command, and ``dynamoctl config
get-contexts`` / ``use-context`` / ``current-context``, against a real daemon."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.conftest import Cluster, record, register_records, start_cluster

WORKER = "c0c0c0c0c0c00001"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = start_cluster(tmp_path_factory.mktemp("contexts"))
    try:
        register_records(started.store_url, [record(WORKER)])
        started.seen([WORKER])
        yield started
    finally:
        started.stop()


def config(cluster: Cluster, tmp_path: Path, current: str = "") -> dict[str, str]:
    """A file with two contexts, ``lab`` (the daemon) and ``gone`` (no daemon there)."""
    path = tmp_path / "config.toml"
    head = f'current_context = "{current}"\n' if current else ""
    path.write_text(
        f'# two fleets\n{head}timeout = 5\n\n[contexts.lab]\nendpoint = "{cluster.cli.endpoint}"\n'
        f'\n[contexts.gone]\nendpoint = "unix://{tmp_path / "none.sock"}"\n'
    )
    return {"DYNAMOCTL_CONFIG": str(path), "DYNAMO_ENDPOINT": ""}


def test_the_current_context_is_used_and_context_picks_another(
    cluster: Cluster, tmp_path: Path
) -> None:
    env = config(cluster, tmp_path, current="gone")
    assert cluster.cli.run("workers", "ls", env=env).code == 3  # nobody at gone's socket
    listed = cluster.cli.run("workers", "ls", "-o", "name", "--context", "lab", env=env)
    assert (listed.code, listed.out) == (0, f"{WORKER}\n")
    before = cluster.cli.run("--context=lab", "workers", "ls", "-o", "name", env=env)
    assert before.out == f"{WORKER}\n"


def test_use_context_writes_the_file_and_get_contexts_marks_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    env = config(cluster, tmp_path)
    assert cluster.cli.run("config", "current-context", env=env).code == 1
    assert (
        "switched to context 'lab'" in cluster.cli.ok("config", "use-context", "lab", env=env).out
    )
    written = Path(env["DYNAMOCTL_CONFIG"]).read_text()
    assert written.startswith('current_context = "lab"\n# two fleets\n')
    assert cluster.cli.ok("config", "current-context", env=env).out == "lab\n"
    rows = [line.split() for line in cluster.cli.ok("config", "get-contexts", env=env).lines]
    assert rows == [
        ["CURRENT", "NAME", "ENDPOINT"],
        ["gone", f"unix://{tmp_path / 'none.sock'}"],
        ["*", "lab", cluster.cli.endpoint],
    ]
    assert cluster.cli.ok("workers", "ls", "-o", "name", env=env).out == f"{WORKER}\n"
    cluster.cli.ok("config", "use-context", "gone", env=env)
    again = Path(env["DYNAMOCTL_CONFIG"]).read_text()
    assert again.count("current_context") == 1 and 'current_context = "gone"' in again


def test_a_context_not_in_the_file_names_those_that_are(cluster: Cluster, tmp_path: Path) -> None:
    env = config(cluster, tmp_path)
    refused = cluster.cli.run("workers", "ls", "--context", "prod", env=env)
    assert refused.code == 2
    assert "context 'prod' is not in config file" in refused.err
    assert "(its contexts: gone, lab)" in refused.err
    assert cluster.cli.run("config", "use-context", "prod", env=env).code == 1
