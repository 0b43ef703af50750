"""Dynamo's file store read in place: the captured tree of a live fleet listed, a
rename (Dynamo's taint update) seen at once, temporary files skipped, keep-alive touches
changing nothing, a file older than 10 s dead by Dynamo's own rule, deleted or not, and
a file too large to read refused unread."""

from __future__ import annotations

import gc
import os
import shutil
import time
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import pytest

from dynamod.errors import StoreUnavailableError, UnsupportedError
from dynamod.records import WorkerRecord
from dynamod.store import KEEP, Delete, Entry, Put, Resync
from dynamod.store.dynamo import DynamoStore
from dynamod.store.dynamo.cards import MAX_RECORD_BYTES
from dynamod.store.dynamo.file_source import EXPIRY
from tests.dynamo import values
from tests.support.streams import next_event

BASE = "190056e6754187c"  # the captured worker with a LoRA card
OTHER = "31d10c8421c11fd2"


def file_of(root: Path, key: str) -> Path:
    bucket, _, rest = key.removeprefix("v1/").partition("/")
    return root / "v1" / bucket / quote(rest, safe="").replace("-", "%2D").replace("_", "%5F")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The captured tree, every file touched now (as its live owners would keep it)."""
    tree = tmp_path / "dynamo_store_kv"
    shutil.copytree(values.DATA / "file_live_tree", tree)
    for path in tree.rglob("*"):
        if path.is_file():
            os.utime(path)
    return tree


@pytest.fixture
async def store(root: Path) -> AsyncIterator[DynamoStore]:
    opened = await DynamoStore.open(f"dynamo+file://{root}")
    try:
        yield opened
    finally:
        await opened.aclose()


def ids(entries: list[Entry]) -> list[str]:
    return sorted(WorkerRecord.from_bytes(e.value).instance_id for e in entries)


async def test_the_captured_tree_lists_both_workers_with_the_lora(store: DynamoStore) -> None:
    entries, _ = await store.list("v1/workers")
    assert ids(entries) == [BASE, OTHER]
    base = WorkerRecord.from_bytes(next(e for e in entries if BASE in e.key).value)
    shown = store.with_adapters(base).extra["dynamo"]
    assert (shown["loras"], shown["lora_count"]) == (["lab-lora"], 1)
    assert base.system_address.startswith("http://127.0.0.1:")


def test_file_names_are_dynamos_percent_encoding(root: Path) -> None:
    assert file_of(root, f"v1/mdc/dynamo/backend/generate/{BASE}/lab-lora").exists()
    query = f"v1/instances/dynamo/backend/worker_kv_query_source_d3ed5e7b4f1b/{BASE}"
    assert file_of(root, query).exists()


async def test_a_rename_over_the_card_is_a_taint_change_at_once(
    store: DynamoStore, root: Path
) -> None:
    async with store.watch("v1/workers") as watch:
        first = await next_event(watch)
        assert isinstance(first, Resync) and len(first.entries) == 2
        card = file_of(root, f"v1/mdc/dynamo/backend/generate/{OTHER}")
        temporary = card.with_name(".tmp_5f3a9c0d11e2b7a4")
        temporary.write_bytes(values.with_taints(card.read_bytes(), ["pool=batch"]))
        temporary.rename(card)  # what Dynamo's route does: O_EXCL .tmp_*, then rename(2)
        changed = await next_event(watch)
    assert isinstance(changed, Put) and OTHER in changed.key
    assert WorkerRecord.from_bytes(changed.entry.value).taints == (
        "dynamo.topology/zone=b",
        "pool=batch",
    )


async def test_temporary_files_and_keep_alive_touches_change_nothing(
    store: DynamoStore, root: Path
) -> None:
    before, revision = await store.list("v1/workers")
    card = file_of(root, f"v1/mdc/dynamo/backend/generate/{OTHER}")
    (card.parent / ".tmp_00000000deadbeef").write_bytes(b"half a card")
    os.utime(card)  # Dynamo's keep-alive: mtime only, same inode, same bytes
    after, now = await store.list("v1/workers")
    assert (after, now) == (before, revision)


async def test_a_file_older_than_dynamos_ttl_is_dead_even_if_nobody_deleted_it(
    store: DynamoStore, root: Path
) -> None:
    async with store.watch("v1/workers") as watch:
        await next_event(watch)
        stale = time.time() - EXPIRY - 1
        os.utime(file_of(root, f"v1/instances/dynamo/backend/generate/{OTHER}"), (stale, stale))
        gone = await next_event(watch, within=5)  # the next scan: one tick at most
    assert isinstance(gone, Delete) and gone.key.endswith(OTHER)
    assert file_of(root, f"v1/mdc/dynamo/backend/generate/{OTHER}").exists()  # never touched


async def test_an_orphaned_tree_lists_nobody(tmp_path: Path) -> None:
    tree = tmp_path / "orphaned"
    shutil.copytree(values.DATA / "file_live_tree", tree)  # keeps the capture's old mtimes
    async with await DynamoStore.open(f"dynamo+file://{tree}") as store:
        assert (await store.list("v1/workers"))[0] == []


async def test_every_write_is_refused_and_nothing_is_written(
    store: DynamoStore, root: Path
) -> None:
    files = sorted(p.name for p in root.rglob("*"))
    key = f"v1/workers/dynamo/backend/generate/{OTHER}"
    for attempt in (
        store.put(key, b"{}", lease=KEEP),
        store.delete(key),
        store.grant(10),
    ):
        with pytest.raises(UnsupportedError, match="never writes"):
            await attempt
    assert sorted(p.name for p in root.rglob("*")) == files


async def test_a_directory_that_is_not_there_yet_is_an_empty_fleet(tmp_path: Path) -> None:
    async with await DynamoStore.open(f"dynamo+file://{tmp_path}/later") as store:
        assert (await store.list("v1/workers"))[0] == []
        assert await store.get("v1/workers/dynamo/backend/generate/1f") is None


async def test_an_unreadable_store_is_unavailable_not_a_crash(
    store: DynamoStore, root: Path
) -> None:
    bucket = root / "v1" / "mdc"
    shutil.rmtree(bucket)
    bucket.write_text("not a directory")  # listing it fails as a permission error would
    with pytest.raises(StoreUnavailableError, match="cannot read Dynamo's file store"):
        await store.list("v1/workers")


async def test_files_too_large_to_read_are_refused_unread_and_leave_nothing_behind(
    store: DynamoStore, root: Path
) -> None:
    """Six cards of 5 MiB: each is refused by its size and counted, once (its keep-alive
    touches change nothing), and none is read: the memory Python holds after them is
    within one card of what it held before."""
    await store.list("v1/workers")
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for number in range(0x6000, 0x6006):
            card = file_of(root, values.card_key(number))
            card.write_bytes(values.card(number)[:-1] + b',"pad":"' + b"x" * (5 << 20) + b'"}')
            file_of(root, values.instance_key(number)).write_bytes(values.instance(number))
        entries, _ = await store.list("v1/workers")
        os.utime(card)  # a keep-alive touch of the last one
        await store.list("v1/workers")
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert ids(entries) == [BASE, OTHER]
    assert store.refusals.count == 6
    assert after - before < MAX_RECORD_BYTES, f"{(after - before) / 2**20:.1f} MiB kept"
