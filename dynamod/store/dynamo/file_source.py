"""A Dynamo fleet on Dynamo's file store (``DYN_DISCOVERY_BACKEND=file``): read, never written.

Layout (Dynamo 1.6.1, ``lib/runtime/src/storage/kv/file.rs``): one file per key at
``<root>/v1/<bucket>/<rest of the key>``, the rest percent-encoded byte by byte outside
``[A-Za-z0-9]`` (``dynamo%2Fbackend%2Fgenerate%2F31d10c8421c11fd2``), holding exactly
the value etcd would. A process writes a file as ``.tmp_<hex>`` and links or renames it
into place (those are skipped here), and keeps its own files alive by touching their
mtime every ~3.3 s; a file whose mtime is more than 10 s old belongs to a dead process,
and the next Dynamo process to tick deletes it.

**Liveness is that same rule**: a file older than ``expiry`` (10 s) is dead here, even if
no Dynamo process has deleted it yet (with none running, stale files stay on disk for
ever). So a SIGKILLed worker leaves the listing 10-11 s after its last touch, before
Dynamo's own sweep removes its files (12-13 s measured); a graceful stop removes them at
once.

Changes are seen through inotify on the two bucket directories (a link, a rename or an
unlink: at once) and a scan every ``tick`` (1 s: the expiry rule, keep-alive touches,
directories that did not exist yet, or no inotify at all). A scan stats every file and
reads only those whose inode, size or mtime changed, in a thread. Revisions are this
process's own counter: one per change seen, comparable only within this store.

Reads are bounded: a file larger than ``MAX_RECORD_BYTES`` by its size is not read at
all, one that grew past it meanwhile is read no further than that, and either is handed
on as a ``TooLarge`` (refused, nothing kept). A LoRA adapter's card is never read: only
its name counts (``roster``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import unquote

from dynamod.errors import StoreUnavailableError
from dynamod.store.base import Delete, Entry, Put, Watch
from dynamod.store.dynamo.addresses import SystemAddresses
from dynamod.store.dynamo.cards import MAX_RECORD_BYTES, Part, TooLarge
from dynamod.store.dynamo.keys import WorkerRef, parse_key
from dynamod.store.dynamo.roster import Change, Refusals, Roster
from dynamod.store.file.inotify import IN_CREATE, IN_DELETE, IN_MOVED_TO, Inotify
from dynamod.tasks import cancel_and_wait

log = logging.getLogger(__name__)

EXPIRY: Final = 10.0
"""Seconds after its last touch that Dynamo's file store counts a file dead."""
TICK: Final = 1.0
BUCKETS: Final = ("mdc", "instances")
TEMPORARY: Final = ".tmp"
IN_MOVED_FROM: Final = 0x00000040
MASK: Final = IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM


@dataclass(frozen=True)
class Seen:
    """A file as last read: what tells a change, and its value at our revision (None for
    a file that is never read: a LoRA card)."""

    inode: int
    size: int
    mtime_ns: int
    part: Part | None


class Scanner:
    """The files under a Dynamo file store's buckets, as changes of Dynamo's keys. Not
    thread-safe: one scan at a time (``FileSource`` holds a lock)."""

    def __init__(self, root: Path, expiry: float) -> None:
        self.root = root
        self.expiry = expiry
        self.revision = 0
        self._seen: dict[str, Seen] = {}

    def scan(self, now: Callable[[], float] = time.time) -> list[Change]:
        """Every change since the last scan, each at a revision of its own."""
        changes: list[Change] = []
        live: set[str] = set()
        oldest = now() - self.expiry
        for bucket in BUCKETS:
            directory = self.root / "v1" / bucket
            for name in _names(directory):
                key = f"v1/{bucket}/{unquote(name)}"
                alive, change = self._look(directory / name, key, oldest)
                if alive:
                    live.add(key)
                if change is not None:
                    changes.append(change)
        for key in sorted(set(self._seen) - live):
            del self._seen[key]
            changes.append(Delete(key, self._next()))
        return changes

    def _look(self, path: Path, key: str, oldest: float) -> tuple[bool, Change | None]:
        """Whether the file is alive, and its change since the last look."""
        old = self._seen.get(key)
        try:
            stat = path.stat()
            if stat.st_mtime < oldest:
                return False, None  # dead by Dynamo's own rule, deleted or not
            if old is not None and (old.inode, old.size, old.mtime_ns) == _identity(stat):
                return True, None
            if _is_lora(key):  # only its name counts: seen once, never read
                self._seen[key] = Seen(*_identity(stat), None)
                return True, None if old is not None else Put(Entry(key, b"", self._next()))
            value = _read(path, stat.st_size)
        except FileNotFoundError:
            return False, None  # removed between the listing and now
        if old is not None and _same(old.part, value, stat.st_size):
            self._seen[key] = Seen(*_identity(stat), old.part)  # a keep-alive touch
            return True, None
        part: Part
        if value is None:
            part = TooLarge(key, stat.st_size, self._next())
            change: Change = part
        else:
            part = Entry(key, value, self._next())
            change = Put(part)
        self._seen[key] = Seen(*_identity(stat), part)
        return True, change

    def _next(self) -> int:
        self.revision += 1
        return self.revision


def _read(path: Path, size: int) -> bytes | None:
    """The file's bytes, or None when it is over ``MAX_RECORD_BYTES`` (by its size, or by
    what it holds now: read no further than one byte past the limit)."""
    if size > MAX_RECORD_BYTES:
        return None
    with path.open("rb") as file:
        value = file.read(MAX_RECORD_BYTES + 1)
    return None if len(value) > MAX_RECORD_BYTES else value


def _same(part: Part | None, value: bytes | None, size: int) -> bool:
    """Whether a file read again holds what it held (a large one: as large as it was)."""
    if isinstance(part, Entry):
        return part.value == value
    return isinstance(part, TooLarge) and value is None and part.size == size


def _is_lora(key: str) -> bool:
    found = parse_key(key)
    return found is not None and found.kind == "lora"


def _names(directory: Path) -> list[str]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []  # no Dynamo process has written this bucket yet
    return sorted(n for n in names if not n.startswith(TEMPORARY))


def _identity(stat: os.stat_result) -> tuple[int, int, int]:
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


class FileSource:
    """Dynamo's file store, joined; see the module docstring."""

    def __init__(
        self,
        root: Path,
        addresses: SystemAddresses,
        refusals: Refusals,
        *,
        expiry: float = EXPIRY,
        tick: float = TICK,
    ) -> None:
        self.root = root
        self._scanner = Scanner(root, expiry)
        self._roster = Roster(addresses, refusals)
        self._tick = tick
        self._lock = asyncio.Lock()
        self._watches: set[Watch] = set()
        self._wakeup = asyncio.Event()
        self._notify: Inotify | None = None
        self._armed: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, root: Path, addresses: SystemAddresses, refusals: Refusals) -> FileSource:
        source = cls(root, addresses, refusals)
        try:
            await source.ping()
        except StoreUnavailableError as exc:
            log.warning("%s; the fleet is empty until it is", exc)  # Dynamo may start later
        source.start()
        return source

    def start(self) -> None:
        try:
            self._notify = Inotify()
        except OSError as exc:
            log.warning("no inotify (%s): scanning %s every %g s", exc, self.root, self._tick)
        else:
            asyncio.get_running_loop().add_reader(self._notify.fileno(), self._readable)
        self._task = asyncio.create_task(self._follow(), name=f"Dynamo file store {self.root}")

    async def list(self, prefix: str) -> tuple[list[Entry], int]:
        await self.scan()
        return self._roster.entries(prefix), self._scanner.revision

    async def get(self, ref: WorkerRef) -> Entry | None:
        await self.scan()
        return self._roster.entry(ref)

    def adapters(self, ref: WorkerRef) -> Collection[str]:
        return self._roster.adapters(ref)

    async def ping(self) -> None:
        if not await asyncio.to_thread(self.root.is_dir):
            raise StoreUnavailableError(
                f"Dynamo's file store {str(self.root)!r} is not a directory (yet): start a "
                "Dynamo process with DYN_FILE_KV set to it, or check the path"
            )

    @contextlib.asynccontextmanager
    async def stream(self, watch: Watch) -> AsyncIterator[None]:
        self._watches.add(watch)
        watch.lost()  # the consumer starts from a Resync (a list, which scans first)
        try:
            yield
        finally:
            self._watches.discard(watch)

    async def scan(self) -> None:
        """Look at the files now and pass every change on to the watches."""
        async with self._lock:
            try:
                changes = await asyncio.to_thread(self._scanner.scan)
            except OSError as exc:  # permissions, a vanished mount: retried like a store outage
                raise StoreUnavailableError(
                    f"cannot read Dynamo's file store {str(self.root)!r}: {exc}"
                ) from None
            for change in changes:
                for shown in self._roster.apply(change):
                    for watch in self._watches:
                        watch.push(shown)

    async def aclose(self) -> None:
        notify, self._notify = self._notify, None
        if notify is not None:
            asyncio.get_running_loop().remove_reader(notify.fileno())
            notify.close()
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def _follow(self) -> None:
        """Scan at every change inotify reports, and every tick; never raises."""
        while True:
            self._arm()
            self._wakeup.clear()
            try:
                await self.scan()
            except StoreUnavailableError as exc:
                log.warning("%s; scanning again in %g s", exc, self._tick)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._tick):
                    await self._wakeup.wait()

    def _arm(self) -> None:
        """Watch each bucket directory once it exists."""
        if self._notify is None:
            return
        for bucket in BUCKETS:
            directory = self.root / "v1" / bucket
            if bucket in self._armed or not directory.is_dir():
                continue
            try:
                self._notify.add(directory, MASK, bucket)
            except OSError as exc:
                log.warning("cannot watch %s (%s): scanning it every %g s", directory, exc,
                            self._tick)  # fmt: skip
            self._armed.add(bucket)

    def _readable(self) -> None:
        if self._notify is None:
            return
        try:
            changed = self._notify.drain()
        except OSError as exc:
            log.warning("reading inotify for %s failed (%s); scanning", self.root, exc)
            changed = {"all"}
        if changed:
            self._wakeup.set()
