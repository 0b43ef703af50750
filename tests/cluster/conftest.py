"""A 3-member etcd cluster and a 3-node NATS cluster with JetStream, each started once per
module; a test may kill or freeze members, and they are back, thawed and started again,
before the next test. The ``figures`` of a scenario go where the chaos ones go."""

from __future__ import annotations

import signal
from collections.abc import Iterator, Sequence

import pytest

from tests.chaos.conftest import figures
from tests.conftest import start_server
from tests.servers import EtcdCluster, NatsCluster, ServerProcess

__all__ = ["figures"]


@pytest.fixture(scope="module")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd-cluster"))
    start_server(cluster)
    yield cluster
    cluster.stop()


@pytest.fixture
def etcd3(etcd_cluster: EtcdCluster) -> Iterator[EtcdCluster]:
    """The module's etcd cluster, whole again after the test."""
    yield etcd_cluster
    thaw(etcd_cluster.members)
    etcd_cluster.start()


@pytest.fixture(scope="module")
def nats_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    cluster = NatsCluster(tmp_path_factory.mktemp("nats-cluster"))
    start_server(cluster)
    yield cluster
    cluster.stop()


@pytest.fixture
def nats3(nats_cluster: NatsCluster) -> Iterator[NatsCluster]:
    """The module's NATS cluster, whole again after the test."""
    yield nats_cluster
    thaw(nats_cluster.members)
    nats_cluster.start()


def thaw(members: Sequence[ServerProcess]) -> None:
    """SIGCONT to every running member: harmless unless a test froze it."""
    for member in members:
        if member.running and member.proc is not None:
            member.proc.send_signal(signal.SIGCONT)
