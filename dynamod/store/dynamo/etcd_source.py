"""A Dynamo fleet on etcd, read through our own etcd store (``dynamod.store.etcd``: its
members, failover, TLS, logins and watch streams), at the root of etcd's keyspace where
Dynamo keeps its keys.

* ``list`` is one linearizable read of ``v1/`` (cards and endpoint records at one
  revision, so the join never sees half a change), joined anew.
* ``get`` reads one worker's card and its endpoint record afresh (two keys, never its
  LoRA cards): what a taint update computes on.
* Each watch is one etcd watch of ``v1/`` with its own ``Roster``: the first snapshot is
  joined before the watch counts as established, so the consumer's first ``Resync``
  (a ``list``, linearizable, later) is never older than the state the feed goes on
  from; every later change of Dynamo's keys is joined and passed on at its revision.
  ``adapters`` answers from the newest watch's roster.

No value outlives its join: a snapshot and each change are dropped once applied. A card
over the reader's limit (etcd configured with a large ``--max-request-bytes`` takes one)
still costs its decoding; once it is refused and dropped, the memory it took is handed
back to the system (``malloc_trim``: glibc keeps freed pages otherwise, and a few 50 MB
cards would leave hundreds of MB of RSS behind).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import functools
from collections.abc import AsyncIterator, Callable, Collection

from dynamod.store.base import Entry, Resync, Watch
from dynamod.store.dynamo.addresses import SystemAddresses
from dynamod.store.dynamo.keys import ROOT, WorkerRef
from dynamod.store.dynamo.roster import Refusals, Roster
from dynamod.store.etcd import EtcdStore
from dynamod.tasks import cancel_and_wait


class EtcdSource:
    """Dynamo's keys in etcd, joined; see the module docstring."""

    def __init__(self, etcd: EtcdStore, addresses: SystemAddresses, refusals: Refusals) -> None:
        self._etcd = etcd
        self._addresses = addresses
        self._refusals = refusals
        self._live: list[Roster] = []
        """The rosters of the watches running now, oldest first."""

    @classmethod
    async def open(cls, url: str, addresses: SystemAddresses, refusals: Refusals) -> EtcdSource:
        return cls(await EtcdStore.open(url), addresses, refusals)

    async def list(self, prefix: str) -> tuple[list[Entry], int]:
        roster = self._roster()
        revision = await self._load(roster)
        return roster.entries(prefix), revision

    async def get(self, ref: WorkerRef) -> Entry | None:
        card = await self._etcd.get(ref.card_key)
        instance = await self._etcd.get(ref.instance_key)
        parts = [e for e in (card, instance) if e is not None]
        del card, instance
        roster = self._roster()
        roster.load(parts)
        del parts
        found = roster.entry(ref)
        _released(roster, 0)
        return found

    async def _load(self, roster: Roster) -> int:
        """Load ``roster`` from one read of Dynamo's keys (dropped once joined)."""
        entries, revision = await self._etcd.list(ROOT)
        roster.load(entries)
        del entries
        _released(roster, 0)
        return revision

    def adapters(self, ref: WorkerRef) -> Collection[str]:
        return self._live[-1].adapters(ref) if self._live else ()

    async def ping(self) -> None:
        await self._etcd.get(ROOT)

    @contextlib.asynccontextmanager
    async def stream(self, watch: Watch) -> AsyncIterator[None]:
        async with self._etcd.watch(ROOT) as raw:
            roster = await self._first(raw)
            if roster is None:  # the store closed meanwhile
                watch.close()
                yield
                return
            watch.lost()
            self._live.append(roster)
            task = asyncio.create_task(_pump(raw, roster, watch), name="Dynamo fleet feed")
            try:
                yield
            finally:
                self._live.remove(roster)
                await cancel_and_wait(task)

    async def _first(self, raw: Watch) -> Roster | None:
        """The watch's first event, its ``Resync``, joined (and dropped: only the roster
        stays)."""
        first = await anext(raw, None)
        if not isinstance(first, Resync):
            return None
        roster = self._roster()
        roster.load(first.entries)
        del first
        _released(roster, 0)
        return roster

    async def aclose(self) -> None:
        await self._etcd.aclose()

    def _roster(self) -> Roster:
        return Roster(self._addresses, self._refusals)


async def _pump(raw: Watch, roster: Roster, watch: Watch) -> None:
    try:
        async for event in raw:
            large = roster.too_large
            if isinstance(event, Resync):
                roster.load(event.entries)
                watch.lost()
            else:
                for change in roster.apply(event):
                    watch.push(change)
            del event  # not kept while the next one is awaited: it may be a large value
            _released(roster, large)
    finally:
        watch.close()  # the etcd watch ended (the store closed): so does this one


def _released(roster: Roster, before: int) -> None:
    """Hand freed memory back to the system when ``roster`` dropped a record too large to
    read since it counted ``before`` (its bytes are gone by now)."""
    if roster.too_large > before:
        _trim()


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    found = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(found), "malloc_trim", None) if found else None
    return trim if callable(trim) else None  # glibc has it; musl and macOS do not


def _trim() -> None:
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
