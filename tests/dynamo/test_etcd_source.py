"""A Dynamo fleet on a real etcd: registration seen as Dynamo makes it, taint updates and
removals seen at their revisions, a fresh read per worker, a card not understood left out
while the rest goes on, a card too large to read leaving no memory behind, and nothing of
Dynamo's ever written."""

from __future__ import annotations

import gc
import re
import tracemalloc
from collections.abc import AsyncIterator, Iterator

import pytest

from dynamod.errors import UnsupportedError
from dynamod.records import WorkerRecord
from dynamod.store import KEEP, Delete, Put, Resync
from dynamod.store.dynamo import DynamoStore
from dynamod.store.dynamo.cards import MAX_RECORD_BYTES
from dynamod.store.etcd import EtcdStore
from tests.dynamo import values
from tests.dynamo.fleet import RoomyEtcd
from tests.support.eventually import eventually
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


@pytest.fixture(scope="module")
def roomy_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RoomyEtcd]:
    etcd = RoomyEtcd(tmp_path_factory.mktemp("roomy-etcd"))
    etcd.start()
    try:
        yield etcd
    finally:
        etcd.stop()


def large_card(number: int) -> bytes:
    """A card like the captured one, one byte over the reader's limit and then some."""
    card = values.card(number)
    return card[:-1] + b',"padding":"' + b"x" * (MAX_RECORD_BYTES + 1024) + b'"}'


async def test_cards_too_large_to_read_leave_no_memory_behind(roomy_etcd: RoomyEtcd) -> None:
    """Six cards over 4 MiB, which an etcd configured for large requests takes: each is
    refused and counted, and nothing of them stays: the memory Python holds after all six
    is within one card of what it held before."""
    etcd = await EtcdStore.open(roomy_etcd.url())
    store = await DynamoStore.open(f"dynamo+etcd://{roomy_etcd.endpoint}")
    tracemalloc.start()
    try:
        async with store.watch(WORKERS) as watch:
            await next_event(watch)
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            lease = await etcd.grant(30)
            for number in range(0x6000, 0x6006):
                await etcd.put(values.instance_key(number), values.instance(number), lease=lease)
                await etcd.put(values.card_key(number), large_card(number), lease=lease)
            await eventually(lambda: _count(store), lambda n: n == 6, what="six refusals")
            assert (await store.list(WORKERS))[0] == []  # a fresh read refuses them too
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
        await etcd.revoke(lease)
    finally:
        tracemalloc.stop()
        await store.aclose()
        await etcd.aclose()
    assert after - before < MAX_RECORD_BYTES, f"{(after - before) / 2**20:.1f} MiB kept"


async def _count(store: DynamoStore) -> int:
    return store.refusals.count
