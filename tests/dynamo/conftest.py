"""Fixtures for the Dynamo fleet tests: Dynamo's keys on the session's etcd (at the root,
under ``v1/``, where Dynamo keeps them: cleared around each test), a stand-in worker, and
(``fleet.py``) real Dynamo 1.6.1 fleets."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from dynamod.store.etcd import EtcdStore
from tests.support.servers import EtcdServer


async def _clear(etcd: EtcdStore) -> None:
    entries, _ = await etcd.list("v1")
    for entry in entries:
        await etcd.delete(entry.key)


@pytest.fixture
async def dynamo_etcd(etcd_server: EtcdServer) -> AsyncIterator[EtcdStore]:
    """An etcd store on the root of the session's etcd: what Dynamo's processes write.
    Other tests keep their keys under prefixes of their own."""
    etcd = await EtcdStore.open(etcd_server.url())
    await _clear(etcd)
    try:
        yield etcd
    finally:
        await _clear(etcd)
        await etcd.aclose()


@pytest.fixture
def dynamo_url(etcd_server: EtcdServer) -> str:
    return f"dynamo+etcd://{etcd_server.endpoint}"
