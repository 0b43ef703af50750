"""A store seen through a link the test can cut: the in-process stand-in for a network
partition (or a process frozen mid-call) between one contender and the store.

While cut, every call through ``Partition`` waits until the link heals: a refresh never
returns, so the lease expires on the store while its holder is still running. Watches are
passed through untouched (a partitioned leader learning late is what the deadline is for).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from dynamod.store import Entry, Lease, Store, Watch
from dynamod.store.base import LeaseArg


class Partition(Store):
    def __init__(self, inner: Store) -> None:
        super().__init__(inner.url, timeout=inner.timeout)
        self.inner = inner
        self._healed = asyncio.Event()
        self._healed.set()

    def cut(self) -> None:
        self._healed.clear()

    def heal(self) -> None:
        self._healed.set()

    @classmethod
    async def open(cls, url: str, *, timeout: float = 5.0) -> Partition:  # noqa: ASYNC109
        raise NotImplementedError("wrap an open store: Partition(store)")

    @classmethod
    def check_url(cls, url: str) -> None:
        raise NotImplementedError

    async def get(self, key: str) -> Entry | None:
        await self._healed.wait()
        return await self.inner.get(key)

    async def put(
        self, key: str, value: bytes, *, expect: int | None = None, lease: LeaseArg = None
    ) -> int:
        await self._healed.wait()
        return await self.inner.put(key, value, expect=expect, lease=lease)

    async def delete(self, key: str, *, expect: int | None = None) -> None:
        await self._healed.wait()
        await self.inner.delete(key, expect=expect)

    async def list(self, prefix: str) -> tuple[list[Entry], int]:
        await self._healed.wait()
        return await self.inner.list(prefix)

    async def grant(self, ttl: float) -> Lease:
        await self._healed.wait()
        return await self.inner.grant(ttl)

    async def refresh(self, lease: Lease) -> None:
        await self._healed.wait()
        await self.inner.refresh(lease)

    async def revoke(self, lease: Lease) -> None:
        await self._healed.wait()
        await self.inner.revoke(lease)

    @contextlib.asynccontextmanager
    async def watch(self, prefix: str, *, since: int | None = None) -> AsyncIterator[Watch]:
        async with self.inner.watch(prefix, since=since) as watch:
            yield watch

    def _stream(
        self, watch: Watch, prefix: str, since: int | None
    ) -> contextlib.AbstractAsyncContextManager[None]:
        raise NotImplementedError("watch() goes to the inner store")

    async def _close(self) -> None:
        """The inner store belongs to the test, which closes it."""
