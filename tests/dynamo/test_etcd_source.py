"""A Dynamo fleet on a real etcd: registration seen as Dynamo makes it, taint updates and
removals seen at their revisions, a fresh read per worker, a card not understood left out
while the rest goes on, and nothing of Dynamo's ever written."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest

from dynamod.errors import UnsupportedError
from dynamod.records import WorkerRecord
from dynamod.store import KEEP, Delete, Put, Resync
from dynamod.store.dynamo import DynamoStore
from dynamod.store.etcd import EtcdStore
from tests.dynamo import values
from tests.support.streams import next_event

A, B = 0x13B0A2323C37860C, 0x13B0A2323C378618
WORKERS = "v1/workers"


@pytest.fixture
async def fleet(dynamo_etcd: EtcdStore, dynamo_url: str) -> AsyncIterator[DynamoStore]:
    store = await DynamoStore.open(dynamo_url)
    try:
        yield store
    finally:
        await store.aclose()


async def register(etcd: EtcdStore, number: int, **card: object) -> None:
    lease = await etcd.grant(30)
    await etcd.put(values.card_key(number), values.card(number, **card), lease=lease)  # type: ignore[arg-type]
    await etcd.put(values.instance_key(number), values.instance(number), lease=lease)


def record(event: object) -> WorkerRecord:
    assert isinstance(event, Put)
    return WorkerRecord.from_bytes(event.entry.value)


async def test_workers_appear_change_and_leave_as_dynamo_writes_them(
    fleet: DynamoStore, dynamo_etcd: EtcdStore
) -> None:
    await register(dynamo_etcd, A, taints=["pool=slow", "gpu"])
    async with fleet.watch(WORKERS) as watch:
        first = await next_event(watch)
        assert isinstance(first, Resync) and len(first.entries) == 1
        await register(dynamo_etcd, B, zone="b")
        added = record(await next_event(watch))
        assert (added.instance_id, added.taints) == (f"{B:x}", ("dynamo.topology/zone=b",))
        entry = await dynamo_etcd.get(values.card_key(A))
        assert entry is not None
        await dynamo_etcd.put(
            values.card_key(A), values.with_taints(entry.value, ["pool=fast"]), lease=KEEP
        )
        changed = await next_event(watch)
        assert record(changed).taints == ("pool=fast",)
        await dynamo_etcd.delete(values.instance_key(B))  # SIGTERM: the endpoint goes first
        gone = await next_event(watch)
        assert isinstance(gone, Delete) and gone.key.endswith(f"{B:x}")
    fresh = await fleet.get(f"{WORKERS}/dynamo/backend/generate/{A:x}")
    assert fresh is not None and fresh.revision == changed.revision


async def test_a_card_not_understood_leaves_one_worker_out_and_the_fleet_goes_on(
    fleet: DynamoStore, dynamo_etcd: EtcdStore
) -> None:
    lease = await dynamo_etcd.grant(30)
    bad = values.mutated(values.card(A), top={"type": "ModelV2"})
    await dynamo_etcd.put(values.card_key(A), bad, lease=lease)
    await dynamo_etcd.put(values.instance_key(A), values.instance(A), lease=lease)
    await register(dynamo_etcd, B)
    entries, _ = await fleet.list(WORKERS)
    assert [WorkerRecord.from_bytes(e.value).instance_id for e in entries] == [f"{B:x}"]
    assert fleet.refusals.count == 1


async def test_the_store_writes_nothing_of_dynamos(
    fleet: DynamoStore, dynamo_etcd: EtcdStore
) -> None:
    await register(dynamo_etcd, A)
    before = await dynamo_etcd.list("v1")
    with pytest.raises(UnsupportedError, match="dynamoctl taints"):
        await fleet.put(f"{WORKERS}/dynamo/backend/generate/{A:x}", b"{}", expect=1)
    with pytest.raises(UnsupportedError):
        await fleet.revoke(await dynamo_etcd.grant(5))
    assert await dynamo_etcd.list("v1") == before


async def test_the_url_takes_our_etcd_options_and_refuses_a_prefix() -> None:
    from dynamod.errors import ConfigError

    DynamoStore.check_url("dynamo+etcd://10.0.0.1:2379,10.0.0.2?tls=true")
    with pytest.raises(ConfigError, match="root of etcd"):
        DynamoStore.check_url("dynamo+etcd://10.0.0.1:2379/dynamo")
    with pytest.raises(ConfigError, match=r"bogus"):
        DynamoStore.check_url("dynamo+etcd://10.0.0.1:2379?bogus=1")
    with pytest.raises(ConfigError, match=re.escape("dynamo+file:///absolute/directory")):
        DynamoStore.check_url("dynamo+file://relative/dir")
