"""Real processes for the hostile-input tests: a ``dynamo-worker`` and a ``dynamod`` on a
file store, started once per module, with short HTTP time bounds so a slow client's fate
is decided in about a second. Tests talk to them with raw sockets and plain clients."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.processes import Spawned, daemon_argv, started, worker_argv

HEAD_TIMEOUT = 1.0
BODY_TIMEOUT = 1.0
IDLE_TIMEOUT = 2.0
TOKEN = "worker-route-token"
LIMITS = {
    "http-head-timeout": HEAD_TIMEOUT,
    "http-body-timeout": BODY_TIMEOUT,
    "http-idle-timeout": IDLE_TIMEOUT,
}


@dataclass(frozen=True)
class Fleet:
    worker: Spawned
    daemon: Spawned
    socket: Path

    def address(self, surface: str) -> tuple[str, int]:
        """``front``, ``inference`` or ``system``: the host and port it listens on."""
        url = {
            "front": self.daemon.field("http"),
            "inference": self.worker.field("http"),
            "system": self.worker.field("system"),
        }[surface]
        host, _, port = url.removeprefix("http://").rpartition(":")
        return host, int(port)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    where = tmp_path_factory.mktemp("hostile")
    store = (where / "store").as_uri()
    (where / "token").write_text(TOKEN)
    flags = [f"--{name}={value}" for name, value in LIMITS.items()]
    argv = worker_argv(store, "llama", "--token-file", str(where / "token"), *flags)
    worker = started(argv, r"^dynamo-worker ready:", where / "worker.err")
    try:
        socket = where / "d.sock"
        env = {f"DYNAMO_{k.replace('-', '_').upper()}": str(v) for k, v in LIMITS.items()}
        daemon = started(
            daemon_argv(store, socket), r"^dynamod ready:.* workers=1 ", where / "d.err", env
        )
        try:
            yield Fleet(worker, daemon, socket)
        finally:
            daemon.finish()
    finally:
        worker.finish()
