"""The real thing for CLI tests: a ``dynamod`` process on a file store, mocker workers
(or records registered straight into the store, for pinned ids), and ``dynamoctl`` run as
a subprocess exactly as an operator runs it.

Processes here are plain ``subprocess`` ones, so a daemon can live for a whole test module
(module-scoped fixtures have no event loop); tests call ``Cli.run`` and get the exit
status, stdout and stderr back. Every run checks stderr for tracebacks and friends unless
told otherwise. The environment is isolated: no DYNAMO_* variables, no colour, a config
directory of the test's own.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dynamod.records import ModelCard, RuntimeConfig, WorkerRecord
from dynamod.taints import with_topology
from tests.support.processes import (
    BAD_STDERR,
    Lines,
    Spawned,
    daemon_argv,
    dynamoctl,
    env,
    started,
    worker_argv,
)

READY_WITHIN = 30.0
# dynamoctl runs hundreds of times here: let it cache bytecode as an installed package does
# (outside the tree), instead of compiling every module on every run.
PYCACHE = Path(tempfile.gettempdir()) / f"dynamoctl-tests-pycache-{os.getuid()}"


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """The product's environment minus anything that would leak into dynamoctl."""
    base = {k: v for k, v in env().items() if not k.startswith(("DYNAMO", "_DYNAMOCTL"))}
    for name in ("NO_COLOR", "XDG_CONFIG_HOME", "RUNTIME_DIRECTORY", "COLUMNS"):
        base.pop(name, None)
    base["HOME"] = str(home)
    base["XDG_CONFIG_HOME"] = str(home / ".config")
    base["TERM"] = "dumb"
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    base["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    base.update(extra)
    return base


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()


def assert_clean(text: str, what: str = "stderr") -> None:
    for bad in BAD_STDERR:
        assert bad not in text, f"{bad!r} on {what}:\n{text}"


@dataclass
class Cli:
    """Runs ``dynamoctl`` against one endpoint, in an isolated environment."""

    endpoint: str
    home: Path
    extra_env: dict[str, str] = field(default_factory=dict)

    def env(self, **extra: str) -> dict[str, str]:
        return clean_env(self.home, **{"DYNAMO_ENDPOINT": self.endpoint, **self.extra_env, **extra})

    def run(self, *args: str, env: dict[str, str] | None = None, clean: bool = True) -> Result:
        """``dynamoctl ARGS`` with ``env`` on top of the isolated environment."""
        done = subprocess.run(
            dynamoctl(*args),
            input="",
            capture_output=True,
            text=True,
            env=self.env(**(env or {})),
            timeout=60,
            check=False,
        )
        if clean:
            assert_clean(done.stderr)
        return Result(done.returncode, done.stdout, done.stderr)

    def ok(self, *args: str, env: dict[str, str] | None = None) -> Result:
        result = self.run(*args, env=env)
        assert result.code == 0, f"dynamoctl {' '.join(args)} exited {result.code}:\n{result.err}"
        return result


def on_terminal(cli: Cli, *args: str, answer: bytes = b"", **env: str) -> tuple[int, str]:
    """Run dynamoctl with a pseudo-terminal as stdin, stdout and stderr; type ``answer``
    once it asks something. Returns the exit status and everything the terminal showed."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        dynamoctl(*args), stdin=slave, stdout=slave, stderr=slave, env=cli.env(TERM="xterm", **env)
    )
    os.close(slave)
    shown = b""
    try:
        while True:
            readable, _, _ = select.select([master], [], [], 30)
            assert readable, f"dynamoctl {args} went quiet on the terminal:\n{shown!r}"
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the other side closed
                break
            shown += chunk
            if answer and b"[y/N]" in shown:
                os.write(master, answer)
                answer = b""
    finally:
        os.close(master)
    return proc.wait(timeout=30), shown.decode(errors="replace")


class Stream:
    """A streaming dynamoctl (``events tail``, ``workers ls --watch``) read line by line,
    each read bounded by a deadline; ``stop()`` ends it with SIGINT like Ctrl-C."""

    def __init__(self, cli: Cli, *args: str) -> None:
        self.proc = subprocess.Popen(
            dynamoctl(*args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=cli.env(),
        )
        assert self.proc.stdout is not None
        self.lines = Lines(self.proc.stdout.fileno(), self.proc.args)

    def line(self, within: float = 20.0) -> str:
        line = self.lines.next(within)
        assert line is not None, f"{self.proc.args!r} ended early: {self.proc.wait()}"
        return line

    def event(self, within: float = 20.0) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.line(within))
        return parsed

    def stop(self) -> Result:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        out, err = self.proc.communicate(timeout=30)
        rest = self.lines.buffer + out
        return Result(self.proc.returncode, rest.decode(), err.decode())

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()


@dataclass
class Cluster:
    """One dynamod on a file store, the workers started beside it, and a CLI for it."""

    root: Path
    store_url: str
    daemon: Spawned
    cli: Cli
    workers: list[Spawned] = field(default_factory=list)

    def start_workers(self, *specs: tuple[str, Sequence[str]]) -> list[Spawned]:
        """Start one mocker worker per (model, extra args), all at once; wait for all."""
        started = []
        for model, args in specs:
            log = self.root / f"worker-{len(self.workers)}.log"
            argv = worker_argv(self.store_url, model, *args)
            spawned = Spawned(argv, r"^dynamo-worker ready:", log)
            self.workers.append(spawned)
            started.append(spawned)
        return [s.wait_ready() for s in started]

    def stop(self) -> None:
        for proc in [*self.workers, self.daemon]:
            proc.stop()
        assert_clean(self.daemon.log, "dynamod's stderr")

    def seen(self, ids: Sequence[str]) -> None:
        """Wait until dynamod's view holds every worker in ``ids`` (its watch says so)."""
        pending = set(ids)
        with Stream(self.cli, "workers", "ls", "--watch", "-o", "json") as watch:
            while pending:
                event = watch.event()
                if event["event"] != "REMOVED":
                    pending.discard(event["worker"]["id"])
            assert watch.stop().code == 0

    def settle(self, revision: int) -> None:
        """Wait until dynamod's view has reached store revision ``revision``."""
        with Stream(self.cli, "events", "tail", "--since", str(revision - 1), "-o", "json") as tail:
            while tail.event()["revision"] < revision:
                pass
            assert tail.stop().code == 0


def start_cluster(root: Path, *daemon_args: str) -> Cluster:
    """dynamod on a fresh file store under ``root``, listening on ``root/d.sock``."""
    root.mkdir(parents=True, exist_ok=True)
    store = (root / "store").as_uri()
    sock = root / "d.sock"
    argv = daemon_argv(store, sock, *daemon_args)
    daemon = started(argv, r"^dynamod ready:", root / "dynamod.log")
    return Cluster(root, store, daemon, Cli(f"unix://{sock}", root / "home"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One daemon for the whole module; tests add workers or records as they need."""
    started = start_cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield started
    finally:
        started.stop()


def record(
    instance_id: str,
    *,
    model: str = "llama",
    taints: Sequence[str] = (),
    topology: dict[str, str] | None = None,
    port: int = 8000,
    started_at: float = 1_700_000_000.0,
) -> WorkerRecord:
    """A worker record with everything pinned, for golden output."""
    domains = dict(topology or {})
    return WorkerRecord(
        instance_id=instance_id,
        namespace="dynamo",
        component="backend",
        endpoint="generate",
        address=f"http://10.0.0.{port % 250}:{port}",
        system_address=f"http://10.0.0.{port % 250}:9090",
        model_card=ModelCard(name=model, engine="mocker", kv_block_size=64),
        runtime_config=RuntimeConfig(
            taints=with_topology(taints, domains), topology_domains=domains
        ),
        started_at=started_at,
        host="node-a",
        pid=4242,
        version="0.1.0",
    )


def register_records(store_url: str, records: Sequence[WorkerRecord], ttl: float = 3600) -> None:
    """Write ``records`` straight into the store under one long lease (no worker process:
    pinned ids and addresses, and cheap enough for a thousand of them)."""
    from dynamod.discovery.registration import register
    from dynamod.store import open_store

    async def write() -> None:
        store = await open_store(store_url)
        try:
            lease = await store.grant(ttl)
            for one in records:
                await register(store, one, lease)
        finally:
            await store.aclose()

    asyncio.run(write())


def normalize_age(text: str) -> str:
    """AGE is the last column of worker tables; it is the only part that moves."""
    ages = re.compile(r"(\S+)$")
    lines = text.splitlines()
    return "\n".join([lines[0], *(ages.sub("<age>", ln) for ln in lines[1:])]) + "\n"


GOLDEN = Path(__file__).parent / "golden"


def golden(name: str, actual: str) -> None:
    """Compare with ``golden/<name>``; ``DYNAMO_UPDATE_GOLDEN=1`` rewrites it instead."""
    path = GOLDEN / name
    if os.environ.get("DYNAMO_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(actual)
    assert path.exists(), f"no golden file {path}; run with DYNAMO_UPDATE_GOLDEN=1 once"
    assert actual == path.read_text(), f"output differs from {path}:\n{actual}"
