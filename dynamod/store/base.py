"""The discovery store contract, and the pieces every backend shares.

A ``Store`` is a small key-value store with revisions, leases and prefix watches. Four
backends implement it (memory, file, etcd, NATS JetStream KV) and one conformance suite
(``tests/store/test_store_contract.py``) holds each of them to this contract:

Keys
    ``/``-separated segments of ``A-Z a-z 0-9 . _ -`` (no empty, ``.`` or ``..`` segment),
    at most 1024 characters. Anything else raises ``InvalidKeyError`` before any I/O; a
    backend that cannot hold a legal key as-is must encode it, never alter it. A *prefix*
    is a key path (or ``""`` for everything) and matches on segment boundaries: ``a/b``
    matches ``a/b`` and ``a/b/c`` but never ``a/bc``.

Revisions
    Every change gets a store revision, strictly increasing across the whole store (etcd's
    revision, the NATS stream sequence, a counter for file and memory). An entry's revision
    is the revision of the change that last wrote it. Revisions are comparable only within
    one store.

``get(key) -> Entry | None``
``put(key, value, *, expect=None, lease=None) -> revision``
    ``expect=None`` writes unconditionally; ``expect=0`` creates only (an existing key raises
    ``RevisionMismatchError``); ``expect=N`` writes only if the key is at revision ``N``
    (another revision raises ``RevisionMismatchError`` carrying ``.actual``; a missing key
    raises ``KeyNotFoundError`` and nothing is created). With ``lease`` the key is bound to
    it and vanishes when the lease ends; with ``lease=KEEP`` the key stays bound to the
    lease it already has (if any; this is how another process rewrites a worker's record
    without ending its liveness); a put with ``lease=None`` unbinds it.
``delete(key, *, expect=None)``
    Removes the key. Without ``expect`` a missing key is not an error (and not an event);
    ``expect=N`` follows the same rules as ``put``.
``list(prefix) -> (entries, revision)``
    Every entry under ``prefix``, sorted by key, as of store revision ``revision``.
``watch(prefix, *, since=None)``
    An async context manager giving a ``Watch``; iterate it for ``Put`` / ``Delete`` /
    ``Resync`` events. Once the ``async with`` is entered the watch is established: any
    change made afterwards is delivered. With ``since=None`` the first event is exactly one
    ``Resync`` (the whole state under the prefix, possibly empty). With ``since=R`` the
    changes after revision ``R`` are replayed, or, when the backend no longer has that
    history, a ``Resync`` comes first. Then ``Put`` / ``Delete`` follow in store order,
    with no gap. Another ``Resync`` arrives whenever the consumer fell too far behind or the
    backend lost its stream (reconnect, compaction): events are never silently dropped.
    Closing the store ends every watch's iteration cleanly.
Leases
    ``grant(ttl) -> Lease``; ``refresh(lease)`` keeps it alive for another ``ttl`` (raises
    ``LeaseExpiredError`` once it is gone); ``revoke(lease)`` ends it at once. When a lease
    ends, its keys are deleted and watchers see a ``Delete`` for each, within ``ttl`` plus
    about a second. ``keep_alive(store, lease)`` runs the refresh loop for an owner.
``aclose()``
    Ends watches, cancels the store's own tasks, closes connections. Idempotent. Any call
    afterwards raises ``StoreClosedError``.
``check_url(url)`` (a classmethod)
    Checks a URL and every file it names as ``open`` would, without connecting or changing
    anything: ``ConfigError`` names the first problem.

Errors are ours, translated inside each backend module: ``KeyNotFoundError``,
``RevisionMismatchError``, ``StoreUnavailableError`` (retryable: every call has a deadline,
nothing hangs), ``StoreClosedError``, ``LeaseExpiredError``, ``InvalidKeyError``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from typing import Final, Literal, Self

from dynamod.backoff import Backoff
from dynamod.catchup import CatchUpQueue
from dynamod.errors import (
    InvalidInputError,
    InvalidKeyError,
    NotLeaderError,
    StoreClosedError,
    StoreUnavailableError,
    UnsupportedError,
)

log = logging.getLogger(__name__)

RESYNC_FIRST: Final = 0.05
RESYNC_CAP: Final = 2.0
"""Bounds of the back-off between attempts to list a prefix again for a ``Resync``."""

MAX_KEY = 1024
_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")
DEFAULT_TIMEOUT = 5.0
WATCH_QUEUE = 4096


@dataclass(frozen=True)
class Swap:
    """One key of ``Store.swap_all``: ``value`` written at ``key`` if the key is at revision
    ``expect`` (> 0: it exists), keeping its lease."""

    key: str
    value: bytes
    expect: int


@dataclass(frozen=True)
class Guard:
    """The condition of a fenced ``swap_all``: ``key`` (a leader key) still at revision
    ``revision`` (> 0), compared in the same transaction as the writes, so a writer whose
    term ended cannot write, however late its request arrives (``pools/leader.py``)."""

    key: str
    revision: int


@dataclass(frozen=True)
class Entry:
    key: str
    value: bytes
    revision: int


@dataclass(frozen=True)
class Put:
    entry: Entry

    @property
    def key(self) -> str:
        return self.entry.key

    @property
    def revision(self) -> int:
        return self.entry.revision


@dataclass(frozen=True)
class Delete:
    key: str
    revision: int


@dataclass(frozen=True)
class Resync:
    entries: tuple[Entry, ...]
    revision: int


WatchEvent = Put | Delete | Resync


@dataclass(frozen=True)
class Lease:
    id: int
    ttl: float


KEEP: Final = "keep"
"""``put(..., lease=KEEP)``: keep whatever lease the key is bound to."""

LeaseArg = Lease | Literal["keep"] | None


def validate_key(key: str, *, prefix: bool = False) -> str:
    """Return ``key`` if it follows the key grammar; raise ``InvalidKeyError`` otherwise."""
    if prefix and key == "":
        return key
    what = "prefix" if prefix else "key"
    if len(key) > MAX_KEY:
        raise InvalidKeyError(f"store {what} of {len(key)} characters; the limit is {MAX_KEY}")
    for segment in key.split("/"):
        if not _SEGMENT.fullmatch(segment) or segment in (".", ".."):
            raise InvalidKeyError(
                f"store {what} {key!r} has segment {segment!r}; segments are non-empty runs "
                "of A-Z, a-z, 0-9, '.', '_' and '-' separated by '/' (not '.' or '..')"
            )
    return key


def check_swaps(swaps: Sequence[Swap], guard: Guard | None, limit: int) -> None:
    """``swap_all``'s arguments: 1 to ``limit`` keys, each (and the guard) at a revision > 0,
    the guard's key not among them; ``InvalidInputError`` names the rule."""
    if not 0 < len(swaps) <= limit or any(s.expect <= 0 for s in swaps):
        raise InvalidInputError(
            f"swap_all takes 1 to {limit} keys, each at a revision > 0 ({len(swaps)})"
        )
    for swap in swaps:
        validate_key(swap.key)
    if guard is not None:
        validate_key(guard.key)
        if guard.revision <= 0 or any(s.key == guard.key for s in swaps):
            raise InvalidInputError(
                f"swap_all's guard {guard.key!r} must be at a revision > 0 ({guard.revision}) "
                "and not one of the keys written"
            )


def guard_lost(guard: Guard, actual: int) -> NotLeaderError:
    """The error of a fenced write whose guard key moved (``actual``: 0 when it is gone)."""
    now = "is gone" if actual == 0 else f"is at revision {actual}"
    return NotLeaderError(
        f"the term that made this write has ended: {guard.key!r} {now}, not at revision "
        f"{guard.revision}; nothing was written"
    )


def in_prefix(key: str, prefix: str) -> bool:
    """Whether ``key`` is ``prefix`` or below it, on segment boundaries."""
    return not prefix or key == prefix or key.startswith(prefix + "/")


class Watch(CatchUpQueue[WatchEvent]):
    """One watch's events, as an async iterator.

    A backend's feed pushes ``Put`` / ``Delete`` into a bounded queue (``push``), or calls
    ``lost()`` when its stream broke and was re-established. The consumer side turns a lost
    stream, an overflowing queue and the initial state into one ``Resync`` built from
    ``list()`` (the queue's catch-up, ``dynamod.catchup``), and then drops queued events the
    snapshot already covers. So one mechanism gives the first snapshot, gap-free recovery
    and bounded memory for slow consumers.
    """

    def __init__(self, store: Store, prefix: str) -> None:
        super().__init__(WATCH_QUEUE)
        self._store = store
        self._prefix = prefix
        self._floor = -1

    def push(self, event: Put | Delete) -> None:
        """Queue one change (called by the backend feed, in store order)."""
        if self._closed or event.revision <= self._floor or not in_prefix(event.key, self._prefix):
            return
        if self.fits():
            self.put(event)
        else:
            log.warning("watch on %r fell %d events behind; resyncing", self._prefix, WATCH_QUEUE)
            self.lost()

    def lost(self) -> None:
        """The feed may have missed changes: the consumer gets a ``Resync`` next."""
        self.fall_behind(drop_queued=True)

    async def catch_up(self, missed: int) -> WatchEvent:
        entries, revision = await self._listed()
        self._floor = max(self._floor, revision)
        self.drop_queued_if(lambda event: event.revision <= revision)
        return Resync(tuple(entries), revision)

    async def _listed(self) -> tuple[list[Entry], int]:
        """The prefix listed, again with back-off while the store is unavailable."""
        backoff = Backoff(RESYNC_FIRST, RESYNC_CAP)
        while True:
            try:
                return await self._store.list(self._prefix)
            except StoreUnavailableError as exc:
                log.warning("watch on %r cannot resync yet: %s", self._prefix, exc)
                await backoff.wait()
            except StoreClosedError:
                raise StopAsyncIteration from None


class Store(abc.ABC):
    """The contract in this module's docstring. Subclasses implement the abstract methods
    and ``_stream``; ``watch`` and the bookkeeping around closing are shared."""

    def __init__(self, url: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.url = url
        self.timeout = timeout
        self._closed = False
        self._watches: set[Watch] = set()

    @classmethod
    @abc.abstractmethod
    async def open(cls, url: str, *, timeout: float = DEFAULT_TIMEOUT) -> Self:  # noqa: ASYNC109
        """Parse ``url``, connect, and return a ready store (``StoreUnavailableError`` if the
        server cannot be reached in time; ``ConfigError`` for a malformed URL); ``timeout``
        is the deadline of every call (``Store.timeout``)."""

    @classmethod
    @abc.abstractmethod
    def check_url(cls, url: str) -> None:
        """Check ``url`` and every file it names as ``open`` would, without connecting or
        changing anything; ``ConfigError`` names the first problem."""

    @abc.abstractmethod
    async def get(self, key: str) -> Entry | None: ...

    @abc.abstractmethod
    async def put(
        self, key: str, value: bytes, *, expect: int | None = None, lease: LeaseArg = None
    ) -> int: ...

    @abc.abstractmethod
    async def delete(self, key: str, *, expect: int | None = None) -> None: ...

    @abc.abstractmethod
    async def list(self, prefix: str) -> tuple[list[Entry], int]: ...

    @abc.abstractmethod
    async def grant(self, ttl: float) -> Lease: ...

    @abc.abstractmethod
    async def refresh(self, lease: Lease) -> None: ...

    @abc.abstractmethod
    async def revoke(self, lease: Lease) -> None: ...

    max_swaps: int = 0
    """Keys one ``swap_all`` may write (0: this store writes one key at a time, and cannot
    fence a write on another key: a leader there fences by time, ``pools/leader.py``)."""

    async def swap_all(self, swaps: Sequence[Swap], *, guard: Guard | None = None) -> int:
        """Every swap's value at its key, each key's lease kept, if every key is at its
        expected revision (and ``guard``'s key at its revision): all or none, in one
        revision (returned). Nothing is written when one differs: ``NotLeaderError`` when it
        is the guard (checked first: the term that made the write has ended), else
        ``RevisionMismatchError`` (or ``KeyNotFoundError``) naming the first key. Not sent
        again after a broken call (as a single compare-and-swap). At most ``max_swaps``
        keys; a store without multi-key transactions refuses (``UnsupportedError``): write
        them one by one."""
        raise UnsupportedError(f"{self.url}: this store writes one key at a time")

    @abc.abstractmethod
    def _stream(
        self, watch: Watch, prefix: str, since: int | None
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """Establish the backend stream for ``watch`` and feed it until the context exits.

        On entry the stream must be established (later changes will be pushed). With
        ``since`` set, push the changes after that revision first, or call
        ``watch.lost()`` when that history is gone; with ``since=None`` call
        ``watch.lost()`` so the consumer starts from a ``Resync``. When the stream breaks,
        re-establish it (with capped back-off) and call ``watch.lost()``. Never raise out of
        the feeding task; the context's exit cancels it.
        """

    @abc.abstractmethod
    async def _close(self) -> None:
        """Release backend resources (connections, tasks). Called once by ``aclose``."""

    @contextlib.asynccontextmanager
    async def watch(self, prefix: str, *, since: int | None = None) -> AsyncIterator[Watch]:
        self._check_open()
        validate_key(prefix, prefix=True)
        watch = Watch(self, prefix)
        self._watches.add(watch)
        try:
            async with self._stream(watch, prefix, since):
                yield watch
        finally:
            watch.close()
            self._watches.discard(watch)

    async def _ready(self, start: Awaitable[None]) -> Self:
        """Await ``start`` (connecting, preparing files) and return the store; if it fails,
        close the store before the error propagates, so ``open`` leaves nothing behind."""
        try:
            await start
        except BaseException:
            await self.aclose()
            raise
        return self

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for watch in list(self._watches):
            watch.close()
        await self._close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.url} is closed")

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def keep_alive(store: Store, lease: Lease) -> None:
    """Refresh ``lease`` every third of its TTL until cancelled.

    A store outage is ridden out with shorter retries; once the lease is really gone
    ``LeaseExpiredError`` propagates so the owner can register again.
    """
    interval = lease.ttl / 3
    while True:
        await asyncio.sleep(interval)
        try:
            await store.refresh(lease)
            interval = lease.ttl / 3
        except StoreUnavailableError as exc:
            log.warning("lease %x not refreshed, retrying: %s", lease.id, exc)
            interval = max(lease.ttl / 10, 0.1)
