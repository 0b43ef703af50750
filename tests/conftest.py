"""Shared fixtures: real servers, and a store of every backend.

etcd runs once per session (each test gets its own key prefix); nats-server starts in
tens of milliseconds, so each test that needs it gets its own. Fault tests ask for
``private_etcd`` / ``nats_server`` and may stop and start them.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from dynamod.store import Store, open_store
from tests.support import envs, leftovers
from tests.support.servers import (
    Cluster,
    EtcdServer,
    NatsServer,
    ServerMissing,
    ServerProcess,
    require_servers,
)

BACKENDS = ["memory", "file", "etcd", "nats"]
SHARED_BACKENDS = ["file", "etcd", "nats"]  # the ones several OS processes can share


SOLO = ("engines", "dynamo", "observe", "chaos", "cluster", "bench")
"""Folders whose tests want the machine to themselves (real engines, a Dynamo fleet,
Prometheus, faults under load, their time bounds): marked ``solo``, run after the rest and
one at a time by ``scripts/test``. A module elsewhere may mark itself ``solo`` too (the
streaming fleet of ``tests/daemon/test_fleet_streams.py``, the elastic pools of
``tests/pools/test_elastic_live.py``)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        path = Path(str(item.path))
        if path.is_relative_to(here) and path.relative_to(here).parts[0] in SOLO:
            item.add_marker(pytest.mark.solo)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the cached environments the collected tests need, before the first test (and
    its timeout) starts (not for ``--collect-only``)."""
    if session.config.option.collectonly:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    say = envs.say_on_stderr if reporter is None else reporter.write_line
    envs.prepare(session.items, say)


@pytest.fixture(scope="session", autouse=True)
def nothing_outlives_the_suite() -> Iterator[None]:
    """Set up before every other fixture, so torn down after all of them: a process the
    suite started that is still alive then fails the run, named (tests/support/leftovers.py)."""
    yield
    message = leftovers.check()
    if message:
        pytest.fail(message, pytrace=False)


@contextlib.contextmanager
def servers_required() -> Iterator[None]:
    """Run the body, which needs a server binary (or openssl): a missing one skips the test,
    and fails it in CI."""
    try:
        yield
    except ServerMissing as exc:
        if require_servers():
            pytest.fail(f"CI needs real servers: {exc}")
        pytest.skip(str(exc))


def start_server(server: ServerProcess | Cluster[Any]) -> None:
    with servers_required():
        server.start()


def _start(server_factory: type[ServerProcess], workdir: Path) -> ServerProcess:
    server = server_factory(workdir)
    start_server(server)
    return server


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = _start(EtcdServer, tmp_path_factory.mktemp("etcd"))
    assert isinstance(server, EtcdServer)
    yield server
    server.stop()


@pytest.fixture
def private_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """An etcd of this test's own, for tests that stop or restart it."""
    server = _start(EtcdServer, tmp_path / "etcd")
    assert isinstance(server, EtcdServer)
    yield server
    server.stop()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = _start(NatsServer, tmp_path / "nats")
    assert isinstance(server, NatsServer)
    yield server
    server.stop()


@pytest.fixture
def etcd_url(etcd_server: EtcdServer) -> str:
    return etcd_server.url(f"t-{uuid.uuid4().hex[:12]}")


def backend_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store URL of ``backend`` for this test."""
    if backend == "memory":
        return "memory://"
    if backend == "file":
        return (tmp_path / "store").as_uri()
    if backend == "etcd":
        url: str = request.getfixturevalue("etcd_url")
        return url
    nats: NatsServer = request.getfixturevalue("nats_server")
    return nats.url()


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request.param, request, tmp_path)


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    async with await open_store(store_url) as opened:
        yield opened


@pytest.fixture(params=SHARED_BACKENDS)
def shared_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL that other OS processes can open too."""
    return backend_url(request.param, request, tmp_path)


@pytest.fixture
async def shared_store(shared_store_url: str) -> AsyncIterator[Store]:
    async with await open_store(shared_store_url) as opened:
        yield opened
