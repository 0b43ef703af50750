"""The servers' own start-up faults: ports handed out twice, a port taken before the server
binds it, a member that cannot start. A cluster that fails to start leaves no process; one
that loses a port to someone else starts on fresh ports."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import start_server
from tests.support import ports
from tests.support.servers import Cluster, EtcdCluster, EtcdServer, NatsCluster, NatsServer

CLUSTERS = ("etcd", "nats")


def make(kind: str, workdir: Path, size: int = 3) -> EtcdCluster | NatsCluster:
    return EtcdCluster(workdir, size) if kind == "etcd" else NatsCluster(workdir, size)


def cluster_ports(cluster: Cluster[Any]) -> list[int]:
    return [getattr(m, name) for m in cluster.members for name in m.port_names]


def processes_in(workdir: Path) -> list[str]:
    """The command lines of our live descendants that name ``workdir``."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and str(workdir) in " ".join(child.cmdline()):
                found.append(" ".join(child.cmdline()))
        except psutil.NoSuchProcess:
            continue
    return found


def test_2000_three_member_clusters_are_never_given_a_port_twice(tmp_path: Path) -> None:
    seen: list[int] = []
    for kind in CLUSTERS:
        for _ in range(1000):
            cluster = make(kind, tmp_path / "c")
            given = cluster_ports(cluster)
            assert len(set(given)) == len(given), f"a port given twice: {sorted(given)}"
            seen += given
    window = seen[:2000]  # a walk repeats only after its slice (~2,800) less what others hold
    assert len(set(window)) == len(window), "a port handed out twice within one walk"
    assert ports.span().stop <= ports.ephemeral_start(), "ports from the ephemeral range"


@pytest.fixture
def held() -> Iterator[list[socket.socket]]:
    """Sockets that hold ports the way another program would; closed after the test."""
    sockets: list[socket.socket] = []
    yield sockets
    for sock in sockets:
        sock.close()


def hold(sockets: list[socket.socket], port: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    sockets.append(sock)


@pytest.mark.parametrize("kind", CLUSTERS)
def test_a_cluster_whose_port_was_taken_starts_on_fresh_ports(
    kind: str, tmp_path: Path, held: list[socket.socket]
) -> None:
    cluster = make(kind, tmp_path)
    taken = cluster.members[1].port
    hold(held, taken)
    try:
        start_server(cluster)
        assert all(m.ready() for m in cluster.members)
        assert taken not in cluster_ports(cluster)
        log = (cluster.members[1].log_path).read_text().lower()
        assert "address already in use" in log, "the first try did not meet the taken port"
    finally:
        cluster.stop()
    assert processes_in(tmp_path) == []


@pytest.mark.parametrize("kind", CLUSTERS)
def test_a_cluster_failing_at_its_second_member_leaves_no_process(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = make(kind, tmp_path)
    second = cluster.members[1]
    argv = second.argv
    monkeypatch.setattr(second, "argv", lambda: [*argv(), "--no-such-flag"])
    with pytest.raises(RuntimeError, match="exited with"):
        start_server(cluster)
    assert processes_in(tmp_path) == []
    assert not any(m.running for m in cluster.members)


@pytest.mark.parametrize("kind", CLUSTERS)
def test_a_server_whose_port_was_taken_starts_on_a_fresh_one(
    kind: str, tmp_path: Path, held: list[socket.socket]
) -> None:
    server = EtcdServer(tmp_path) if kind == "etcd" else NatsServer(tmp_path)
    taken = server.port
    hold(held, taken)
    try:
        start_server(server)
        assert server.ready() and server.port != taken
    finally:
        server.stop()
    assert processes_in(tmp_path) == []
