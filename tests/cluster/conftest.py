"""A 3-member etcd cluster and a 3-node NATS cluster with JetStream, each started once per
module; a test may kill or freeze members, and they are back, thawed and started again,
before the next test. The ``figures`` of a scenario go where the chaos ones go."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

import pytest

from tests.chaos.conftest import figures
from tests.conftest import start_server
from tests.support.servers import Cluster, EtcdCluster, NatsCluster

__all__ = ["figures"]

C = TypeVar("C", bound=Cluster[Any])


@pytest.fixture(scope="module")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    yield from running(EtcdCluster(tmp_path_factory.mktemp("etcd-cluster")))


@pytest.fixture
def etcd3(etcd_cluster: EtcdCluster) -> Iterator[EtcdCluster]:
    """The module's etcd cluster, whole again after the test."""
    yield from healed(etcd_cluster)


@pytest.fixture(scope="module")
def nats_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    yield from running(NatsCluster(tmp_path_factory.mktemp("nats-cluster")))


@pytest.fixture
def nats3(nats_cluster: NatsCluster) -> Iterator[NatsCluster]:
    """The module's NATS cluster, whole again after the test."""
    yield from healed(nats_cluster)


def running(cluster: C) -> Iterator[C]:
    start_server(cluster)
    yield cluster
    cluster.stop()


def healed(cluster: C) -> Iterator[C]:
    """Yield ``cluster``; then thaw (SIGCONT) every member a test froze, and start every
    member it stopped."""
    yield cluster
    for member in cluster.members:
        member.thaw()
    cluster.start()
