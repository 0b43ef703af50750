"""Real processes for the fuzz tests, started once per module: a ``dynamo-worker`` and a
``dynamod`` on the session's etcd.

Hypothesis runs each example synchronously, so these fixtures are synchronous too: the
processes are plain ``subprocess.Popen``s whose readiness line is read with a deadline,
their stderr goes to a file that teardown checks for tracebacks, and the store is read
with a short ``asyncio.run`` where a test needs the truth from it.
"""

from __future__ import annotations

import asyncio
import re
import selectors
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dynamod.store import Entry, open_store
from tests.procs import BAD_STDERR, daemon_argv, env, worker_argv
from tests.servers import EtcdServer

READY_WITHIN = 30.0
WORKER_TAINTS = ("capacity/fast", "pool=a")
WORKER_TOPOLOGY = "zone=z1"
MODEL = "fuzz"


class Started:
    """One product process, ready; ``stop()`` ends it and checks its stderr."""

    def __init__(self, argv: list[str], ready: str, log: Path) -> None:
        self.log = log
        self.program = argv[0]
        with log.open("wb") as err:
            self.proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, env=env()
            )
        try:
            self.ready_line = self._ready(re.compile(ready))
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            raise

    def _ready(self, pattern: re.Pattern[str]) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + READY_WITHIN
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not selector.select(deadline - time.monotonic()):
                    continue
                line = self.proc.stdout.readline().decode()
                if not line:
                    break
                if pattern.search(line):
                    return line
        raise AssertionError(f"{self.program} not ready:\n{self.log.read_text()}")

    def field(self, name: str) -> str:
        match = re.search(rf"\b{name}=(\S+)", self.ready_line)
        assert match, f"no {name}= in {self.ready_line!r}"
        return match.group(1)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> str:
        """SIGTERM, wait, and the stderr it wrote (asserted free of tracebacks)."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        text = self.log.read_text(errors="replace")
        for bad in BAD_STDERR:
            assert bad not in text, f"{bad!r} on stderr of {self.program}:\n{text}"
        return text


@dataclass(frozen=True)
class Stack:
    store_url: str
    worker: Started
    daemon: Started
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
    worker = Started(argv, r"^dynamo-worker ready:", where / "worker.err")
    try:
        socket = where / "d.sock"
        daemon = Started(daemon_argv(url, socket), r"^dynamod ready:.* workers=1 ", where / "d.err")
        try:
            yield Stack(url, worker, daemon, socket)
        finally:
            daemon.stop()
    finally:
        worker.stop()
