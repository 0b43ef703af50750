"""Registering a worker: its record created on its lease, kept alive and followed.

``register`` creates a record bound to a lease (or replays the same incarnation's
registration); ``Registration`` owns a worker's registration for its whole life: the
lease's keep-alive, following its own record (a change outside the taints made out of
band is written back: ``updates.within_boundary``), registering again when the lease is
lost, and deregistering at the end.

A worker never registers a record its own reader refuses: ``register`` first checks that
the record reads back exactly as written (``readable``) and refuses it otherwise, with
the reason, before anything is written. Writing back is bounded too: after each
write-back that committed, the next one waits the one back-off's next delay
(``backoff.py``; started over once a record this registration did not write is followed:
real progress), bytes that the store already holds and the reader refuses are never
written again, and every wait is cancellable. So a writer that keeps spoiling the record
(or a bug) costs a few writes a second at most, never a loop that wakes every watcher
thousands of times a second.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

from dynamod.backoff import Backoff
from dynamod.discovery.updates import parse_stored, within_boundary
from dynamod.errors import (
    InvalidInputError,
    KeyNotFoundError,
    LeaseExpiredError,
    RevisionMismatchError,
    StoreClosedError,
    StoreUnavailableError,
)
from dynamod.records import WorkerRecord, immutable_diff
from dynamod.store import KEEP, Delete, Lease, Put, Resync, Store, keep_alive
from dynamod.taints import caller_taints
from dynamod.tasks import cancel_and_wait, race

log = logging.getLogger(__name__)

REREGISTER_FIRST = 0.1
REREGISTER_CAP = 2.0
"""Bounds of the back-off between attempts to register again after the lease was lost."""
RESTORE_FIRST = 0.05
RESTORE_CAP = 2.0
"""Bounds of the back-off before each write-back of a record changed out of band."""


def new_instance_id() -> str:
    """A fresh id for one process incarnation: 16 hex digits."""
    return secrets.token_hex(8)


def readable(record: WorkerRecord) -> None:
    """Check that ``record`` reads back exactly as it is written; ``InvalidInputError``
    naming why not (a field the reader refuses: a count out of range, a boolean where a
    number belongs). A record that fails this must never reach the store: every reader,
    the worker's own included, would refuse it."""
    raw = record.to_bytes()
    try:
        back = WorkerRecord.from_bytes(raw)
    except InvalidInputError as exc:
        raise InvalidInputError(
            f"worker record {record.key} is not registered: its own reader refuses it ({exc})"
        ) from None
    if back.to_bytes() != raw:
        raise InvalidInputError(
            f"worker record {record.key} is not registered: it does not read back as written"
        )


async def register(store: Store, record: WorkerRecord, lease: Lease) -> tuple[WorkerRecord, int]:
    """Create ``record`` bound to ``lease``; return the stored record and its revision.
    A record that does not read back as written (``readable``) raises
    ``InvalidInputError`` before anything is written.

    If the key already exists, this is the same incarnation replaying its registration: the
    immutable boundary is checked (a different record under this id raises
    ``ImmutableFieldError`` naming the field) and the stored record wins, taints included.
    It is rebound to ``lease`` with the same bytes, so watchers see no change.
    """
    readable(record)
    try:
        return record, await store.put(record.key, record.to_bytes(), expect=0, lease=lease)
    except RevisionMismatchError:
        pass
    entry = await store.get(record.key)
    if entry is None:  # it expired between the two calls: create it after all
        return await register(store, record, lease)
    stored = WorkerRecord.from_bytes(entry.value)
    immutable_diff(stored, record.with_caller_taints(caller_taints(stored.taints)))
    revision = await store.put(record.key, entry.value, expect=entry.revision, lease=lease)
    log.info("worker %s re-registered; keeping its stored taints", record.instance_id)
    return stored, revision


class Registration:
    """A worker's registration for its whole life: lease, keep-alive, current record.

    ``async with Registration(store, record, ttl=10) as reg`` registers, then keeps the lease
    alive and follows the stored record (another process may change its taints) in a task
    this object owns. If the lease is lost anyway (a store outage longer than the TTL, or
    the key deleted by hand), a new lease is granted and the latest record registered again.
    ``deregister()`` (also run on exit) revokes the lease: the record vanishes at once.
    """

    def __init__(self, store: Store, record: WorkerRecord, *, ttl: float = 10.0) -> None:
        self.store = store
        self.record = record
        self.ttl = ttl
        self.revision = 0
        self._lease: Lease | None = None
        self._task: asyncio.Task[None] | None = None
        self._followed = asyncio.Event()

    async def __aenter__(self) -> Registration:
        """Register, and return once the record is followed: from then on every change
        another process makes to it (a taint update) is seen before any later one."""
        await self._register()
        task = self._task = asyncio.create_task(
            self._maintain(), name=f"registration {self.record.key}"
        )
        followed = asyncio.ensure_future(self._followed.wait())
        try:
            await asyncio.wait([followed, task], return_when=asyncio.FIRST_COMPLETED)
        finally:
            followed.cancel()
        if task.done():
            self._task = None
            await self.deregister()
            task.result()  # raises why following failed
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.deregister()

    @property
    def registered(self) -> bool:
        return self._lease is not None

    async def deregister(self) -> None:
        """Stop keeping the record alive and delete it now. Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        lease, self._lease = self._lease, None
        if lease is not None:
            try:
                await self.store.revoke(lease)
            except (StoreUnavailableError, StoreClosedError) as exc:
                log.warning(
                    "could not revoke lease of %s (it expires by itself): %s", self.record.key, exc
                )

    async def _register(self) -> None:
        readable(self.record)  # before a lease is granted: a refused record costs nothing
        self._lease = await self.store.grant(self.ttl)
        self.record, self.revision = await register(self.store, self.record, self._lease)

    async def _maintain(self) -> None:
        while True:
            lease = self._lease
            assert lease is not None
            try:
                await race(keep_alive(self.store, lease), self._follow())
            except LeaseExpiredError as exc:
                log.warning(
                    "worker %s lost its lease (%s); registering again", self.record.key, exc
                )
            await self._register_again()

    async def _follow(self) -> None:
        """Follow the stored record. A change outside the taints (or an unreadable value)
        was made out of band and routers ignore it: the latest valid record is written
        back over it, so the store, the routers and this worker agree again."""
        pace = _WriteBacks()
        async with self.store.watch(self.record.key) as events:
            async for event in events:
                if isinstance(event, Resync) and not event.entries:
                    raise LeaseExpiredError(f"record {self.record.key} is gone")
                if isinstance(event, Delete):
                    raise LeaseExpiredError(f"record {self.record.key} was deleted")
                entry = event.entry if isinstance(event, Put) else event.entries[0]
                stored = parse_stored(entry.value, entry.key, self.record)
                if within_boundary(self.record, stored) is not stored:
                    await pace.wait()
                    pace.wrote(await self._restore(entry.value, entry.revision))
                    continue
                assert stored is not None
                pace.followed(entry.revision)
                self.record, self.revision = stored, entry.revision
                self._followed.set()

    async def _restore(self, spoiled: bytes, revision: int) -> int | None:
        """Write the latest valid record over the out-of-band one (``spoiled``, at
        ``revision``); the revision written, or None. A write that got there first (a
        taint update, or the record's removal) is followed next. Bytes the store already
        holds are never written again: if the reader refused them, writing them would only
        wake every watcher again."""
        if spoiled == self.record.to_bytes():
            log.error(
                "worker %s: the store holds this worker's own record, which its reader "
                "refuses; not writing it again",
                self.record.instance_id,
            )
            return None
        try:
            restored = await self.store.put(
                self.record.key, self.record.to_bytes(), expect=revision, lease=KEEP
            )
        except (RevisionMismatchError, KeyNotFoundError):
            return None
        log.warning(
            "worker %s restored its record at revision %d over the out-of-band change at "
            "revision %d, keeping its latest valid taints %s",
            self.record.instance_id,
            restored,
            revision,
            list(self.record.taints),
        )
        return restored

    async def _register_again(self) -> None:
        backoff = Backoff(REREGISTER_FIRST, REREGISTER_CAP)
        while True:
            try:
                await self._register()
                return
            except StoreUnavailableError as exc:
                log.warning("cannot register %s yet: %s", self.record.key, exc)
            await backoff.wait()


class _WriteBacks:
    """Paces one registration's write-backs (module docstring): after one that committed,
    the next waits the back-off's next delay; a record followed that this registration did
    not write (a taint update: real progress) starts the back-off over."""

    def __init__(self) -> None:
        self._backoff = Backoff(RESTORE_FIRST, RESTORE_CAP)
        self._not_before = 0.0
        self._written: int | None = None

    async def wait(self) -> None:
        delay = self._not_before - asyncio.get_running_loop().time()
        if delay > 0:
            await asyncio.sleep(delay)

    def wrote(self, revision: int | None) -> None:
        if revision is not None:
            self._written = revision
            self._not_before = asyncio.get_running_loop().time() + self._backoff.delay()

    def followed(self, revision: int) -> None:
        if revision != self._written:
            self._backoff.reset()
            self._not_before = 0.0
