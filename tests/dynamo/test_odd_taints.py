"""Taints NVIDIA Dynamo takes and our grammar refuses (``" padded "``, ``""``, a tab), on a
worker of a Dynamo fleet behind an in-process dynamod: tables show them quoted, as ``ls``
shows an odd file name, and each is removable by its exact value, the others kept."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dynamoctl import formats
from dynamod.client import AsyncClient
from dynamod.client.endpoint import Credentials
from dynamod.store.dynamo import DynamoStore
from dynamod.store.etcd import EtcdStore
from dynamod.taints import TaintUpdate
from dynamod.targets import Target
from tests.daemon.helpers import running_daemon, settings_for
from tests.dynamo.fake_worker import FakeDynamoWorker

ODD = 0x13B0A2323C378618
HELD = ("", "\t", " padded ", "pool=a")


@pytest.fixture
async def fleet(
    dynamo_etcd: EtcdStore, dynamo_url: str, tmp_path: Path
) -> AsyncIterator[tuple[AsyncClient, FakeDynamoWorker]]:
    worker = await FakeDynamoWorker(dynamo_etcd, ODD, taints=HELD).start()
    store = await DynamoStore.open(dynamo_url)
    try:
        settings = settings_for(store, tmp_path)
        async with (
            running_daemon(store, settings),
            AsyncClient(settings.listen[0], credentials=Credentials(), timeout=10) as client,
        ):
            yield client, worker
    finally:
        await store.aclose()
        await worker.stop()


async def test_odd_taints_are_shown_quoted(
    fleet: tuple[AsyncClient, FakeDynamoWorker],
) -> None:
    client, worker = fleet
    info = await client.get_worker(worker.id)
    assert info.caller_taints == HELD
    assert formats.taints_text(info.caller_taints) == "'',$'\\t',' padded ',pool=a"
    assert formats.change_text((), (" padded ",)) == "-' padded '"


async def test_each_is_removable_by_its_exact_value(
    fleet: tuple[AsyncClient, FakeDynamoWorker],
) -> None:
    client, worker = fleet
    (done,) = await client.update_taints(TaintUpdate.remove([" padded "]), Target(worker.id))
    assert done.removed == (" padded ",)
    assert await worker.stored_taints() == ["", "\t", "pool=a"]
    (done,) = await client.update_taints(TaintUpdate.remove(["", "\t"]), Target(worker.id))
    assert await worker.stored_taints() == ["pool=a"]
