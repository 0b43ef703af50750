"""The file store across real OS processes sharing one directory, and after crashes.

The other processes run ``tests/store/file_store_child.py``. Crash states that a kill
cannot hit on purpose (a torn journal record, a journaled but unapplied write, a temporary
file) are laid on disk the way a dying writer leaves them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import os
import re
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import dynamod.store.file.watcher as changes_module
from dynamod.errors import ConfigError, StoreUnavailableError
from dynamod.store import Delete, Put, Resync
from dynamod.store.file import FileStore
from dynamod.store.file.journal import DELETE, PUT, Journal, Record, encode
from tests.support.streams import fold, next_event

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def url(tmp_path: Path) -> str:
    return (tmp_path / "store").as_uri()


@pytest.fixture
async def file_store(url: str) -> AsyncIterator[FileStore]:
    store = await FileStore.open(url)
    try:
        yield store
    finally:
        await store.aclose()


@pytest.fixture(params=["inotify", "polling"])
async def watching_store(
    request: pytest.FixtureRequest, url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[FileStore]:
    """A store that learns of other processes' changes through inotify, or, where inotify
    is unavailable, by polling."""
    if request.param == "polling":

        class NoInotify:
            def __init__(self) -> None:
                raise OSError(errno.EMFILE, "inotify instances exhausted")

        monkeypatch.setattr(changes_module, "Inotify", NoInotify)
    store = await FileStore.open(url)
    try:
        yield store
    finally:
        await store.aclose()


@contextlib.asynccontextmanager
async def child(*args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """Another process running ``file_store_child``; killed if still running, then reaped."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.store.file_store_child",
        *args,
        cwd=ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.communicate()


async def read_line(proc: asyncio.subprocess.Process, within: float = 30.0) -> str:
    assert proc.stdout is not None
    async with asyncio.timeout(within):
        line = await proc.stdout.readline()
    if not line:
        _, err = await proc.communicate()
        pytest.fail(f"child exited with {proc.returncode} early:\n{err.decode()}")
    return line.decode().strip()


def newest_journal(store_dir: Path) -> Path:
    return sorted((store_dir / "journal").iterdir())[-1]


async def test_two_processes_racing_compare_and_swap_lose_no_increment(
    file_store: FileStore, url: str
) -> None:
    """2 processes x 200 CAS increments of one key end at 400, and a watcher here sees
    every value from 1 to 400 once, in order."""
    await file_store.put("counter", b"0")
    async with file_store.watch("counter") as watch:
        assert isinstance(await next_event(watch), Resync)
        async with (
            child("incr", url, "counter", "200") as first,
            child("incr", url, "counter", "200") as second,
        ):
            racers = (first, second)
            assert [await read_line(proc) for proc in racers] == ["ready", "ready"]
            for proc in racers:
                assert proc.stdin is not None
                proc.stdin.write(b"go\n")
                await proc.stdin.drain()
            done = [await read_line(proc, within=60) for proc in racers]
        assert all(line.startswith("done ") for line in done)
        values: list[int] = []
        while len(values) < 400:
            event = await next_event(watch)
            assert isinstance(event, Put)
            values.append(int(event.entry.value))
    assert values == list(range(1, 401))
    entry = await file_store.get("counter")
    assert entry is not None and entry.value == b"400"


async def test_a_watcher_here_sees_a_write_made_by_another_process(
    watching_store: FileStore, url: str
) -> None:
    async with watching_store.watch("shared") as watch:
        assert isinstance(await next_event(watch), Resync)
        async with child("put", url, "shared/key", "from-child") as proc:
            revision = int(await read_line(proc))
        event = await next_event(watch)
    assert isinstance(event, Put)
    assert (event.key, event.entry.value, event.revision) == ("shared/key", b"from-child", revision)


async def test_lease_of_a_killed_process_expires_and_this_process_reaps_it(
    watching_store: FileStore, url: str
) -> None:
    """The contract's bound: the Delete arrives within TTL + 1 s of the last refresh, and
    the last refresh came before the SIGKILL."""
    ttl = 1.0
    async with watching_store.watch("workers") as watch:
        assert isinstance(await next_event(watch), Resync)
        async with child("hold", url, "workers/w1", str(ttl)) as proc:
            held = await read_line(proc)
            put = await next_event(watch)
            assert isinstance(put, Put) and held == f"held {put.revision}"
            proc.kill()
            await proc.wait()
        killed = time.monotonic()
        gone = await next_event(watch, within=ttl + 5)
        waited = time.monotonic() - killed
    assert isinstance(gone, Delete) and gone.key == "workers/w1"
    assert waited <= ttl + 1.0, f"Delete came {waited:.2f} s after the kill"
    assert await watching_store.get("workers/w1") is None


async def test_a_lease_written_before_a_reboot_has_expired(file_store: FileStore) -> None:
    lease = await file_store.grant(30)
    await file_store.put("l/key", b"v", lease=lease)
    lease_file = file_store.root / "leases" / f"{lease.id:016x}"
    body = json.loads(lease_file.read_bytes())
    lease_file.write_text(json.dumps(body | {"boot": "a-boot-before-the-last-reboot"}))
    state: dict[str, bytes] = {}
    async with file_store.watch("l") as watch:
        fold(state, await next_event(watch))
        while "l/key" in state:
            fold(state, await next_event(watch, within=5))
    assert await file_store.get("l/key") is None


async def test_leftover_temp_file_of_a_crashed_write_is_ignored_then_removed(url: str) -> None:
    store = await FileStore.open(url)
    await store.put("k", b"v")
    leftover = store.root / "tmp" / "tmpcrashed"
    leftover.write_bytes(b"99 0 k\nhalf of a val")
    entries, _ = await store.list("")
    assert [(e.key, e.value) for e in entries] == [("k", b"v")]
    await store.aclose()
    reopened = await FileStore.open(url)
    try:
        assert not leftover.exists()
        entry = await reopened.get("k")
        assert entry is not None and entry.value == b"v"
    finally:
        await reopened.aclose()


async def test_journal_record_torn_by_a_crash_is_cut_off(url: str, tmp_path: Path) -> None:
    store = await FileStore.open(url)
    revision = await store.put("k", b"v")
    await store.aclose()
    torn = encode(Record(PUT, revision + 1, "k", 0, b"never committed"))
    with newest_journal(tmp_path / "store").open("ab") as journal:
        journal.write(torn[:-4])
    store = await FileStore.open(url)
    try:
        entry = await store.get("k")
        assert entry is not None and (entry.value, entry.revision) == (b"v", revision)
        assert await store.put("k2", b"w") == revision + 1
        async with store.watch("", since=revision) as watch:
            event = await next_event(watch)
        assert isinstance(event, Put) and (event.key, event.revision) == ("k2", revision + 1)
    finally:
        await store.aclose()


@pytest.mark.parametrize("op", [PUT, DELETE])
async def test_journaled_write_whose_writer_died_is_completed_by_the_next_one(
    url: str, tmp_path: Path, op: str
) -> None:
    store = await FileStore.open(url)
    revision = await store.put("k", b"old")
    await store.aclose()
    record = Record(op, revision + 1, "k", 0, b"new" if op == PUT else b"")
    with newest_journal(tmp_path / "store").open("ab") as journal:
        journal.write(encode(record))  # ...and the writer died before replacing the key file
    store = await FileStore.open(url)
    try:
        entry = await store.get("k")
        entries, listed = await store.list("")
    finally:
        await store.aclose()
    assert listed == revision + 1
    if op == PUT:
        assert entry is not None and (entry.value, entry.revision) == (b"new", revision + 1)
        assert [e.value for e in entries] == [b"new"]
    else:
        assert entry is None and entries == []


async def test_writer_killed_at_random_points_leaves_a_consistent_store(url: str) -> None:
    """After each SIGKILL: the journal replayed from the start folds to exactly what
    ``list`` shows, and the next write takes the next revision."""
    for kill_round, writes in enumerate((25, 60, 140)):
        async with child("churn", url) as proc:
            for _ in range(writes):
                await read_line(proc)
            proc.kill()
            await proc.wait()
        store = await FileStore.open(url)
        try:
            entries, revision = await store.list("")
            state: dict[str, bytes] = {}
            async with store.watch("", since=0) as watch:
                seen = 0
                while seen < revision:
                    event = await next_event(watch)
                    assert not isinstance(event, Resync), "the whole history is still journaled"
                    fold(state, event)
                    seen = event.revision
            assert state == {e.key: e.value for e in entries}
            assert await store.put("probe", b"%d" % kill_round) == revision + 1
        finally:
            await store.aclose()


async def test_watchers_follow_the_journal_across_generations(url: str, tmp_path: Path) -> None:
    """With tiny journal generations, a watcher in the writing store and one in a second
    store (which follows the files, like another process) both see every put; history
    older than two generations is gone and replays as a Resync."""
    writer = await FileStore.open(url, journal_bytes=512)
    reader = await FileStore.open(url, journal_bytes=512)
    try:
        revisions: list[int] = []
        async with writer.watch("g") as mine, reader.watch("g") as theirs:
            for watch in (mine, theirs):
                assert isinstance(await next_event(watch), Resync)
            for i in range(60):
                revisions.append(await writer.put(f"g/{i % 4}", b"x" * 40))
                for watch in (mine, theirs):
                    event = await next_event(watch)
                    assert isinstance(event, Put) and event.revision == revisions[-1]
        assert len(list((tmp_path / "store" / "journal").iterdir())) <= 2
        async with reader.watch("g", since=revisions[0]) as old:
            assert isinstance(await next_event(old), Resync)
        async with reader.watch("g", since=revisions[-3]) as recent:
            replayed = [await next_event(recent) for _ in range(2)]
        assert [e.revision for e in replayed if isinstance(e, Put)] == revisions[-2:]
    finally:
        await writer.aclose()
        await reader.aclose()


def test_a_reader_two_generations_behind_jumps_ahead_and_reports_lost_history(
    tmp_path: Path,
) -> None:
    writer = Journal(tmp_path, generation_bytes=100)
    reader = Journal(tmp_path, generation_bytes=100)
    writer.open()
    reader.open()
    try:
        for _ in range(30):
            writer.read_new()
            writer.repair()
            writer.append(PUT, "k", 0, b"v" * 30)
        records, lost = reader.read_new()
        assert lost
        assert records and records[-1].revision == reader.last_revision == 30
        assert reader.since(0) is None
    finally:
        writer.close()
        reader.close()


async def test_a_lock_held_elsewhere_times_out_with_an_error_naming_the_lock(url: str) -> None:
    store = await FileStore.open(url, timeout=0.2)
    lock_path = store.root / "lock"
    other = os.open(lock_path, os.O_RDWR)  # another open file: flock excludes it like a process
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        with pytest.raises(StoreUnavailableError, match=re.escape(str(lock_path))):
            await store.put("k", b"v")
        fcntl.flock(other, fcntl.LOCK_UN)
        assert await store.put("k", b"v") == 1
    finally:
        os.close(other)
        await store.aclose()


async def test_urls_that_name_no_usable_directory_are_refused(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    refused = {
        a_file.as_uri(): "is a file",
        (a_file / "below").as_uri(): "is a file",
        "file://relative/dir": "file:///absolute/path",
        "file:relative": "file:///absolute/path",
    }
    for url, message in refused.items():
        with pytest.raises(ConfigError, match=re.escape(message)):
            await FileStore.open(url)


async def test_a_directory_of_another_format_is_refused(url: str, tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "format").write_bytes(b"dynamod file store 99\n")
    with pytest.raises(ConfigError, match="format"):
        await FileStore.open(url)
