"""Real processes for the fuzz tests, started once per module: a ``dynamo-worker`` and a
``dynamod`` on the session's etcd.

Hypothesis runs each example synchronously, so these fixtures are synchronous too: the
processes are ``tests.support.processes.Spawned`` (plain ``subprocess.Popen``s), and the
store is read with a short ``asyncio.run`` where a test needs the truth from it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dynamod.store import Entry, open_store
from tests.support.processes import Spawned, daemon_argv, started, worker_argv
from tests.support.servers import EtcdServer

WORKER_TAINTS = ("capacity/fast", "pool=a")
WORKER_TOPOLOGY = "zone=z1"
MODEL = "fuzz"


@dataclass(frozen=True)
class Stack:
    store_url: str
    worker: Spawned
    daemon: Spawned
    socket: Path

    @property
    def key(self) -> str:
        return self.worker.field("key")

    @property
    def front(self) -> str:
        return self.daemon.field("http")

    @property
    def system(self) -> str:
        return self.worker.field("system")

    def record(self) -> Entry:
        """The worker's record as the store holds it now."""
        return asyncio.run(_read(self.store_url, self.key))


async def _read(url: str, key: str) -> Entry:
    async with await open_store(url) as store:
        entry = await store.get(key)
    assert entry is not None, f"the worker's record {key} is gone"
    return entry


@pytest.fixture(scope="module")
def stack(etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A worker (``WORKER_TAINTS``, topology ``WORKER_TOPOLOGY``, a long lease: keep-alives
    never rewrite an etcd record) and a dynamod over it, for the whole module."""
    url = etcd_server.url(f"fuzz-{uuid.uuid4().hex[:8]}")
    where = tmp_path_factory.mktemp("fuzz")
    flags = [f for t in WORKER_TAINTS for f in ("--taint", t)]
    argv = worker_argv(url, MODEL, *flags, "--topology", WORKER_TOPOLOGY, "--lease-ttl", "30")
    worker = started(argv, r"^dynamo-worker ready:", where / "worker.err")
    try:
        socket = where / "d.sock"
        daemon = started(daemon_argv(url, socket), r"^dynamod ready:.* workers=1 ", where / "d.err")
        try:
            yield Stack(url, worker, daemon, socket)
        finally:
            daemon.finish()
    finally:
        worker.finish()
