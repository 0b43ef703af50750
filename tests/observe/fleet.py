"""A real fleet for this folder's tests: ``dynamod`` processes on one file store, mocker
workers, ``dynamoctl`` run as an operator runs it, and the tools a test may need (tmux,
Prometheus: ``tool``, skipped when missing, a failure in CI as for etcd).

Processes are plain ``subprocess`` ones (``tests.support.processes.Spawned``), so a fleet
can live for a whole test module."""

from __future__ import annotations

import contextlib
import http.client
import json
import shutil
import subprocess
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import Spawned, daemon_argv, dynamoctl, env, worker_argv
from tests.support.servers import require_servers

MODEL = "llama"


def tool(name: str) -> str:
    """The path of the program ``name``: a missing one skips the test, and fails it in CI
    (``scripts/test-tools`` installs it)."""
    found = shutil.which(name)
    if found is None:
        message = f"{name} is not installed (scripts/test-tools installs it)"
        if require_servers():
            pytest.fail(f"CI needs {name}: {message}")
        pytest.skip(message)
    return found


@dataclass
class Fleet:
    """Daemons on one file store under ``root`` and the workers started beside them."""

    root: Path
    store: str
    daemons: list[Spawned] = field(default_factory=list)
    workers: list[Spawned] = field(default_factory=list)

    def daemon(self, name: str, *args: str, settings: dict[str, str] | None = None) -> Spawned:
        """Start a dynamod listening on ``root/<name>.sock`` (and HTTP on a free port);
        ``settings``: ``DYNAMO_*`` variables."""
        socket = self.root / f"{name}.sock"
        argv = [*daemon_argv(self.store, socket, *args), "--replica-id", name]
        argv[argv.index("--audit-log") + 1] = str(self.root / f"{name}-audit.log")
        log = self.root / f"{name}.log"
        spawned = Spawned(argv, r"^dynamod ready:", log, settings).wait_ready()
        self.daemons.append(spawned)
        return spawned

    def start_workers(self, *specs: tuple[str, ...]) -> list[str]:
        """One mocker worker per tuple of extra arguments, all at once; their ids."""
        started = []
        for args in specs:
            log = self.root / f"worker-{len(self.workers)}.log"
            spawned = Spawned(worker_argv(self.store, MODEL, *args), r"^dynamo-worker ready:", log)
            self.workers.append(spawned)
            started.append(spawned)
        return [s.wait_ready().field("id") for s in started]

    def endpoint(self, daemon: Spawned) -> str:
        return daemon.field("grpc")

    def ctl(
        self, daemon: Spawned, *args: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """``dynamoctl ARGS`` against ``daemon``, stdout a pipe."""
        done = subprocess.run(
            dynamoctl(*args), capture_output=True, text=True, env=self.ctl_env(daemon),
            stdin=subprocess.DEVNULL, timeout=60, check=False,
        )  # fmt: skip
        if check:
            assert done.returncode == 0, (
                f"dynamoctl {args} exited {done.returncode}:\n{done.stderr}"
            )
        return done

    def ctl_env(self, daemon: Spawned) -> dict[str, str]:
        base = {k: v for k, v in env().items() if not k.startswith("DYNAMO")}
        for name in ("NO_COLOR", "COLUMNS", "LINES"):
            base.pop(name, None)
        base.update(DYNAMO_ENDPOINT=self.endpoint(daemon), HOME=str(self.root / "home"))
        base["XDG_CONFIG_HOME"] = str(self.root / "home" / ".config")
        return base

    def stop(self) -> None:
        for proc in [*self.workers, *self.daemons]:
            if proc.alive:
                proc.stop()
            else:
                proc.kill()


@contextlib.contextmanager
def stream_request(
    daemon: Spawned, required: str, max_tokens: int
) -> Iterator[http.client.HTTPResponse]:
    """A streaming completion for a worker holding ``required``, open once its first
    bytes arrived, for as long as the ``with`` block runs."""
    url = urllib.parse.urlsplit(daemon.field("http"))
    connection = http.client.HTTPConnection(url.hostname or "", url.port, timeout=60)
    body: dict[str, Any] = {
        "model": MODEL, "prompt": "tell me a long story", "max_tokens": max_tokens,
        "stream": True, "nvext": {"routing_constraints": {"required_taints": [required]}},
    }  # fmt: skip
    connection.request(
        "POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"}
    )
    try:
        response = connection.getresponse()
        assert response.status == 200, response.read()
        assert response.readline().startswith(b"data: ")
        yield response
    finally:
        connection.close()
