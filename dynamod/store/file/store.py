"""The file store: the discovery store of one machine, a directory shared by its processes.

The daemon, workers and CLI tools open the same directory and see each other's writes; no
server runs. Layout under the root::

    format     the on-disk format; a directory holding another one is refused
    lock       flock'ed by every mutation, and by ``list`` so entries and revision agree
    journal/   change log and revision counter, the commit point    (journal.py)
    keys/      one file per key: the current state                  (keys.py)
    leases/    one file per lease                                   (leases.py)
    tmp/       files of writes in progress; crash left-overs are removed at open

A mutation, all under the lock: read the journal to its end (publishing what other
processes wrote) and cut a torn tail; redo the last record if its writer died before
applying it; check ``expect``; append the record (now it exists); replace the key file;
publish. Every step is synchronous, so the lock is never held across an ``await`` and one
descriptor serves every coroutine of the process; waiting for it is the only await.
``get`` reads one key file without the lock (files are replaced whole), so for a few
microseconds after a record is journaled, ``get`` may still return the previous value.

Watches: an open store tails the journal right after its own writes, and whenever inotify
reports a change in ``journal/`` (where inotify is unavailable: every ``POLL_INTERVAL``),
pushing each record to its watches (``watcher.py``). ``watch(since=R)`` replays from
the journal files; history older than the two newest generations is gone: a ``Resync``.

Leases: each open store owns a reaper task. It sleeps until the earliest lease deadline or
a change in ``leases/``, then deletes, under the lock, the keys of every expired lease and
the lease file last, so a reaper killed half-way leaves work the next one finishes.
Whichever process is alive reaps.

File I/O runs on the event loop: a call does a few small reads and writes, a put about
0.2 ms on ext4 (most of it the rename over the old key file, which starts write-back). Use
a local file system: a stalled network mount would stall the loop. Nothing is fsync'ed:
the store survives killed processes, not power cuts.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import math
import os
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar
from urllib.parse import unquote, urlsplit

from dynamod.errors import (
    ConfigError,
    DynamoError,
    InvalidInputError,
    KeyNotFoundError,
    LeaseExpiredError,
    RevisionMismatchError,
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
)
from dynamod.store.base import (
    DEFAULT_TIMEOUT,
    Delete,
    Entry,
    Lease,
    LeaseArg,
    Put,
    Store,
    Watch,
    validate_key,
)
from dynamod.store.file.inotify import IN_CREATE, IN_DELETE, IN_MODIFY, IN_MOVED_TO
from dynamod.store.file.journal import DELETE, PUT, Journal, Record
from dynamod.store.file.keys import KeyFile, KeyFiles, write_atomic
from dynamod.store.file.leases import LeaseFiles
from dynamod.store.file.lock import FileLock
from dynamod.store.file.watcher import DirectoryWatcher

log = logging.getLogger(__name__)

T = TypeVar("T")

FORMAT = b"dynamod file store 1\n"
JOURNAL_BYTES = 4 * 1024 * 1024
"""Size at which a journal generation is closed; history for ``since=`` is 1-2 of them."""
POLL_INTERVAL = 0.05
"""Without inotify: how often the journal is checked, the bound on cross-process latency."""
REAP_FALLBACK = 0.5
"""Without inotify: how often leases granted by other processes are looked for."""
REAP_RETRY = 1.0
DEADLINE_SLACK = 0.005
"""Timers may fire a little early; waking just after a deadline saves a second round."""


def store_root(url: str) -> Path:
    """The directory of a ``file:///absolute/path`` URL; ``ConfigError`` for anything else."""
    parts = urlsplit(url)
    if (
        parts.scheme != "file"
        or parts.netloc not in ("", "localhost")
        or not parts.path.startswith("/")
        or parts.query
        or parts.fragment
    ):
        raise ConfigError(
            f"file store URL {url!r} is not of the form file:///absolute/path/to/directory"
        )
    return Path(unquote(parts.path))


class FileStore(Store):
    """The store contract (``dynamod.store.base``) over a directory; see the module doc."""

    def __init__(
        self, url: str, *, timeout: float = DEFAULT_TIMEOUT, journal_bytes: int = JOURNAL_BYTES
    ) -> None:
        super().__init__(url, timeout=timeout)
        self.root = store_root(url)
        self._tmp = self.root / "tmp"
        self._journal = Journal(self.root / "journal", generation_bytes=journal_bytes)
        self._keys = KeyFiles(self.root / "keys", self._tmp)
        self._leases = LeaseFiles(self.root / "leases", self._tmp)
        self._lock = FileLock(self.root / "lock")
        self._changes = DirectoryWatcher(
            {
                "journal": (self.root / "journal", IN_MODIFY | IN_CREATE | IN_MOVED_TO),
                "leases": (self.root / "leases", IN_MODIFY | IN_MOVED_TO | IN_DELETE),
            },
            self._on_change,
            interval=POLL_INTERVAL,
        )
        self._reaper: asyncio.Task[None] | None = None
        self._lease_changed = asyncio.Event()

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - the store's deadline for every call
        journal_bytes: int = JOURNAL_BYTES,
    ) -> FileStore:
        """Open the store in the URL's directory, creating it if missing."""
        store = cls(url, timeout=timeout, journal_bytes=journal_bytes)
        return await store._ready(store._start())

    @classmethod
    def check_url(cls, url: str) -> None:
        """The directory, or the nearest existing one above it (open creates the rest), is
        a writable directory; a store already there has this format."""
        root = store_root(url)
        existing = root
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise ConfigError(
                f"file store URL {url!r} names {root}, which is a file or lies under one; "
                "the file store needs a directory"
            )
        if not os.access(existing, os.W_OK | os.X_OK):
            raise ConfigError(
                f"file store directory {existing} is not writable by this user; fix its "
                "permissions or choose another directory"
            )
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            _check_format(root, (root / "format").read_bytes())

    async def get(self, key: str) -> Entry | None:
        self._check_open()
        validate_key(key)
        with self._io(f"read {key!r}"):
            found = self._keys.read(key)
        return None if found is None else found.entry

    async def put(
        self, key: str, value: bytes, *, expect: int | None = None, lease: LeaseArg = None
    ) -> int:
        validate_key(key)
        data = bytes(value)
        return await self._locked(f"put {key!r}", lambda: self._put(key, data, expect, lease))

    async def delete(self, key: str, *, expect: int | None = None) -> None:
        validate_key(key)
        await self._locked(f"delete {key!r}", lambda: self._delete(key, expect))

    async def list(self, prefix: str) -> tuple[list[Entry], int]:
        validate_key(prefix, prefix=True)
        return await self._locked(f"list {prefix!r}", lambda: self._snapshot(prefix))

    async def grant(self, ttl: float) -> Lease:
        if not (isinstance(ttl, int | float) and math.isfinite(ttl) and ttl > 0):
            raise InvalidInputError(f"lease TTL {ttl!r} is not a positive number of seconds")
        lease = await self._locked("grant a lease", lambda: self._leases.create(ttl))
        self._lease_changed.set()  # the reaper learns the new deadline
        return lease

    async def refresh(self, lease: Lease) -> None:
        await self._locked(f"refresh lease {lease.id:x}", lambda: self._refresh(lease))

    async def revoke(self, lease: Lease) -> None:
        await self._locked(f"revoke lease {lease.id:x}", lambda: self._end_leases({lease.id}))

    # -- the critical sections: synchronous, run by _locked ------------------------------

    async def _locked(self, what: str, action: Callable[[], T]) -> T:
        """Run ``action`` under the store lock, after recovering from any crashed writer."""
        self._check_open()
        try:
            async with asyncio.timeout(self.timeout):
                await self._lock.acquire()
        except TimeoutError:
            raise StoreUnavailableError(
                f"store lock {self._lock.path} stayed held by another process for "
                f"{self.timeout} s; if a process is stuck, `fuser {self._lock.path}` names it"
            ) from None
        try:
            with self._io(what):
                self._recover()
                return action()
        finally:
            self._lock.release()

    def _recover(self) -> None:
        self._catch_up()
        self._journal.repair()
        last = self._journal.last_record
        if last is not None and self._keys.apply(last):
            log.warning(
                "store %s: finished revision %d of %r, whose writer died after journaling it",
                self.url,
                last.revision,
                last.key,
            )

    def _put(self, key: str, value: bytes, expect: int | None, lease: LeaseArg) -> int:
        current = self._keys.read(key)
        _check_expect(key, current, expect)
        record = self._journal.append(PUT, key, self._lease_id(current, lease), value)
        self._commit(record)
        return record.revision

    def _delete(self, key: str, expect: int | None) -> None:
        current = self._keys.read(key)
        _check_expect(key, current, expect)
        if current is not None:
            self._commit(self._journal.append(DELETE, key, 0, b""))

    def _snapshot(self, prefix: str) -> tuple[builtins.list[Entry], int]:
        return [found.entry for found in self._keys.scan(prefix)], self._journal.last_revision

    def _refresh(self, lease: Lease) -> None:
        current = self._leases.find(lease.id)
        if current is None:
            raise LeaseExpiredError(f"lease {lease.id:x} has expired or was revoked")
        self._leases.write(current)

    def _end_leases(self, lease_ids: set[int]) -> None:
        for found in self._keys.scan(""):
            if found.lease in lease_ids:
                self._commit(self._journal.append(DELETE, found.entry.key, 0, b""))
        for lease_id in lease_ids:
            self._leases.remove(lease_id)  # last: a crash before this leaves work to redo

    def _expire(self) -> None:
        now = self._leases.clock()
        expired = {i for i, deadline in self._leases.deadlines().items() if deadline <= now}
        if expired:
            log.info("store %s: leases %s expired", self.url, ", ".join(f"{i:x}" for i in expired))
            self._end_leases(expired)

    def _lease_id(self, current: KeyFile | None, lease: LeaseArg) -> int:
        if isinstance(lease, Lease):
            if self._leases.find(lease.id) is None:
                raise LeaseExpiredError(f"lease {lease.id:x} has expired or was revoked")
            return lease.id
        if lease is None or current is None:
            return 0
        return current.lease  # KEEP

    def _commit(self, record: Record) -> None:
        """Tell this process's watches about a journaled record, then apply it to its key
        file. The record exists already: if applying fails, the caller's error means "outcome
        unknown" (as a timeout does with etcd) and the next lock holder redoes it."""
        self._publish([record])
        if record.op == PUT:
            self._keys.write(record)
        else:
            self._keys.remove(record.key)

    # -- following the journal ----------------------------------------------------------

    def _catch_up(self, exclude: Watch | None = None) -> None:
        try:
            records, lost = self._journal.read_new()
        except (OSError, StoreError):
            # Records read before the failure are consumed but not published.
            for watch in self._watches:
                watch.lost()
            raise
        if lost:
            log.warning("store %s: this process fell behind the journal; resyncing", self.url)
            for watch in self._watches:
                if watch is not exclude:  # it replays from the journal files instead
                    watch.lost()
        self._publish(records, exclude)

    def _publish(self, records: Sequence[Record], exclude: Watch | None = None) -> None:
        if not records:
            return
        events = [_event(record) for record in records]
        for watch in self._watches:
            if watch is not exclude:
                for event in events:
                    watch.push(event)

    def _follow(self) -> None:
        """Catch up outside the lock (inotify, polling). Never raises: on a failure every
        watch resyncs, which retries through ``list``."""
        try:
            with self._io("read the journal"):
                self._catch_up()
        except StoreError as exc:
            log.warning("store %s: %s; watches will resync", self.url, exc)

    @contextlib.asynccontextmanager
    async def _stream(self, watch: Watch, prefix: str, since: int | None) -> AsyncIterator[None]:
        if since is None:
            watch.lost()
        else:
            self._replay(watch, since)
        yield  # _publish pushes every later record

    def _replay(self, watch: Watch, since: int) -> None:
        try:
            with self._io("replay the journal"):
                # Others get the newest records now; this watch gets them from the replay.
                self._catch_up(exclude=watch)
                replayed = self._journal.since(since)
        except StoreError as exc:
            log.warning("store %s: cannot replay after revision %d: %s", self.url, since, exc)
            replayed = None
        if replayed is None:
            watch.lost()
            return
        for record in replayed:
            watch.push(_event(record))

    # -- lifecycle ----------------------------------------------------------------------

    async def _start(self) -> None:
        self._make_dirs()
        with self._io("open its files"):
            self._lock.open()
            self._journal.open()
        self._changes.start()
        await self._locked("open", self._prepare)
        self._reaper = asyncio.create_task(self._reap_forever(), name=f"reaper {self.url}")

    def _make_dirs(self) -> None:
        try:
            for sub in ("journal", "keys", "leases", "tmp"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ConfigError(
                f"file store URL {self.url!r} names {self.root}, which is a file or lies under "
                "one; the file store needs a directory"
            ) from None
        except PermissionError as exc:
            raise ConfigError(
                f"file store directory {self.root} cannot be created: {exc.strerror}; "
                "fix its permissions or choose another directory"
            ) from None
        except OSError as exc:
            raise StoreUnavailableError(f"store {self.url} cannot be created: {exc}") from exc

    def _prepare(self) -> None:
        """Check the format and remove crash left-overs: with the lock held no write is in
        progress, so every file in ``tmp/`` belongs to a writer that died."""
        found = self.root / "format"
        try:
            stamp = found.read_bytes()
        except FileNotFoundError:
            write_atomic(self._tmp, found, FORMAT)
            stamp = FORMAT
        _check_format(self.root, stamp)
        for name in os.listdir(self._tmp):
            (self._tmp / name).unlink(missing_ok=True)
            log.info("store %s: removed %s, left by a crashed write", self.url, self._tmp / name)

    def _on_change(self, changed: set[str]) -> None:
        if "leases" in changed and not self._changes.polling:
            self._lease_changed.set()  # polling says nothing new; the reaper has its own bound
        if "journal" in changed and self._watches:
            # Without watches nobody needs the news; the next lock holder reads it anyway.
            self._follow()

    async def _reap_forever(self) -> None:
        """End expired leases (whichever process granted them) until cancelled."""
        while True:
            self._lease_changed.clear()
            try:
                wait = await self._reap()
            except StoreClosedError:
                return
            except StoreError as exc:
                log.warning("store %s: lease reaper: %s; retrying", self.url, exc)
                wait = REAP_RETRY
            if self._changes.polling:
                wait = REAP_FALLBACK if wait is None else min(wait, REAP_FALLBACK)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(None if wait is None else wait + DEADLINE_SLACK):
                    await self._lease_changed.wait()

    async def _reap(self) -> float | None:
        """Reap what has expired; seconds until the next deadline, ``None`` for no lease."""
        with self._io("read its leases"):
            deadlines = self._leases.deadlines().values()
        now = self._leases.clock()
        if any(deadline <= now for deadline in deadlines):
            await self._locked("end expired leases", self._expire)
        return min((deadline - now for deadline in deadlines if deadline > now), default=None)

    async def _close(self) -> None:
        try:
            await self._changes.aclose()
            await self._stop_reaper()
        finally:
            self._journal.close()
            self._lock.close()

    async def _stop_reaper(self) -> None:
        reaper, self._reaper = self._reaper, None
        if reaper is None:
            return
        reaper.cancel()
        await asyncio.wait([reaper])
        if not reaper.cancelled() and reaper.exception() is not None:
            log.error("store %s: lease reaper failed", self.url, exc_info=reaper.exception())

    @contextlib.contextmanager
    def _io(self, what: str) -> Iterator[None]:
        """Translate ``OSError`` into ``StoreUnavailableError``; ours pass through."""
        try:
            yield
        except DynamoError:
            raise
        except OSError as exc:
            raise StoreUnavailableError(f"store {self.url} could not {what}: {exc}") from exc


def _check_expect(key: str, current: KeyFile | None, expect: int | None) -> None:
    if expect is None:
        return
    if current is None and expect != 0:
        raise KeyNotFoundError(key)
    actual = 0 if current is None else current.entry.revision
    if actual != expect:
        raise RevisionMismatchError(key, expect, actual)


def _event(record: Record) -> Put | Delete:
    if record.op == PUT:
        return Put(Entry(record.key, record.value, record.revision))
    return Delete(record.key, record.revision)


def _check_format(root: Path, stamp: bytes) -> None:
    if stamp != FORMAT:
        raise ConfigError(
            f"{root} holds a store of format {stamp[:40]!r}, not {FORMAT!r}: another "
            "program's directory or another version's; choose another directory"
        )
