"""A Dynamo fleet on etcd, read through our own etcd store (``dynamod.store.etcd``: its
members, failover, TLS, logins and watch streams), at the root of etcd's keyspace where
Dynamo keeps its keys.

* ``list`` is one linearizable read of ``v1/`` (cards and endpoint records at one
  revision, so the join never sees half a change), joined anew.
* ``get`` reads one worker's card (with its LoRA cards) and its endpoint record afresh:
  what a taint update computes on.
* Each watch is one etcd watch of ``v1/`` with its own ``Roster``: the first snapshot is
  joined before the watch counts as established, so the consumer's first ``Resync``
  (a ``list``, linearizable, later) is never older than the state the feed goes on
  from; every later change of Dynamo's keys is joined and passed on at its revision.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from dynamod.store.base import Entry, Resync, Watch
from dynamod.store.dynamo.addresses import SystemAddresses
from dynamod.store.dynamo.keys import ROOT, WorkerRef
from dynamod.store.dynamo.roster import Refusals, Roster, join_one
from dynamod.store.etcd import EtcdStore
from dynamod.tasks import cancel_and_wait


class EtcdSource:
    """Dynamo's keys in etcd, joined; see the module docstring."""

    def __init__(self, etcd: EtcdStore, addresses: SystemAddresses, refusals: Refusals) -> None:
        self._etcd = etcd
        self._addresses = addresses
        self._refusals = refusals

    @classmethod
    async def open(cls, url: str, addresses: SystemAddresses, refusals: Refusals) -> EtcdSource:
        return cls(await EtcdStore.open(url), addresses, refusals)

    async def list(self, prefix: str) -> tuple[list[Entry], int]:
        entries, revision = await self._etcd.list(ROOT)
        roster = self._roster()
        roster.load(entries)
        return roster.entries(prefix), revision

    async def get(self, ref: WorkerRef) -> Entry | None:
        cards, _ = await self._etcd.list(ref.card_key)
        instance = await self._etcd.get(ref.instance_key)
        parts = [*cards, instance] if instance is not None else cards
        return join_one(ref, parts, self._addresses, self._refusals)

    async def ping(self) -> None:
        await self._etcd.get(ROOT)

    @contextlib.asynccontextmanager
    async def stream(self, watch: Watch) -> AsyncIterator[None]:
        async with self._etcd.watch(ROOT) as raw:
            first = await anext(raw, None)  # the first event of a watch is its Resync
            if not isinstance(first, Resync):  # the store closed meanwhile
                watch.close()
                yield
                return
            roster = self._roster()
            roster.load(first.entries)
            watch.lost()
            task = asyncio.create_task(_pump(raw, roster, watch), name="Dynamo fleet feed")
            try:
                yield
            finally:
                await cancel_and_wait(task)

    async def aclose(self) -> None:
        await self._etcd.aclose()

    def _roster(self) -> Roster:
        return Roster(self._addresses, self._refusals)


async def _pump(raw: Watch, roster: Roster, watch: Watch) -> None:
    try:
        async for event in raw:
            if isinstance(event, Resync):
                roster.load(event.entries)
                watch.lost()
                continue
            for change in roster.apply(event):
                watch.push(change)
    finally:
        watch.close()  # the etcd watch ended (the store closed): so does this one
