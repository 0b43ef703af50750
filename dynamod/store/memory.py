"""The in-process store: the reference semantics of the contract, and the test double.

Everything happens on the event loop, so each call is atomic. A bounded replay ring of
changes serves ``watch(since=...)``; lease expiry is a timer on the loop, owned by the
store.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from dynamod.errors import ConfigError, KeyNotFoundError, LeaseExpiredError, RevisionMismatchError
from dynamod.store.base import (
    DEFAULT_TIMEOUT,
    KEEP,
    Delete,
    Entry,
    Guard,
    Lease,
    LeaseArg,
    Put,
    Store,
    Swap,
    Watch,
    check_swaps,
    guard_lost,
    in_prefix,
    validate_key,
)

REPLAY = 10_000


@dataclass
class _LeaseState:
    lease: Lease
    keys: set[str] = field(default_factory=set)
    timer: asyncio.TimerHandle | None = None


class MemoryStore(Store):
    def __init__(self, url: str = "memory://") -> None:
        super().__init__(url)
        self._data: dict[str, Entry] = {}
        self._key_lease: dict[str, int] = {}
        self._leases: dict[int, _LeaseState] = {}
        self._revision = 0
        self._replay: deque[Put | Delete] = deque(maxlen=REPLAY)
        self._lease_ids = itertools.count(1)

    @classmethod
    async def open(cls, url: str, *, timeout: float = DEFAULT_TIMEOUT) -> MemoryStore:  # noqa: ASYNC109
        cls.check_url(url)
        store = cls(url)
        store.timeout = timeout
        return store

    @classmethod
    def check_url(cls, url: str) -> None:
        if url != "memory://":
            raise ConfigError(f"memory store URL {url!r} takes nothing after it: use memory://")

    async def get(self, key: str) -> Entry | None:
        self._check_open()
        return self._data.get(validate_key(key))

    async def put(
        self, key: str, value: bytes, *, expect: int | None = None, lease: LeaseArg = None
    ) -> int:
        self._check_open()
        self._check_expect(validate_key(key), expect)
        if isinstance(lease, Lease) and lease.id not in self._leases:
            raise LeaseExpiredError(f"lease {lease.id:x} has expired or was revoked")
        self._revision += 1
        entry = Entry(key, bytes(value), self._revision)
        self._data[key] = entry
        if lease != KEEP:
            self._bind(key, lease)
        self._publish(Put(entry))
        return self._revision

    max_swaps = 64
    """As etcd's (``EtcdStore.max_swaps``): the reference semantics of a fenced batch."""

    async def swap_all(self, swaps: Sequence[Swap], *, guard: Guard | None = None) -> int:
        self._check_open()
        check_swaps(swaps, guard, self.max_swaps)
        if guard is not None:
            held = self._data.get(guard.key)
            actual = 0 if held is None else held.revision
            if actual != guard.revision:
                raise guard_lost(guard, actual)
        for swap in swaps:
            self._check_expect(swap.key, swap.expect)
        self._revision += 1
        for swap in swaps:  # one revision for all, each key's lease kept
            entry = Entry(swap.key, bytes(swap.value), self._revision)
            self._data[swap.key] = entry
            self._publish(Put(entry))
        return self._revision

    async def delete(self, key: str, *, expect: int | None = None) -> None:
        self._check_open()
        self._check_expect(validate_key(key), expect)
        self._remove(key)

    async def list(self, prefix: str) -> tuple[list[Entry], int]:
        self._check_open()
        validate_key(prefix, prefix=True)
        entries = sorted((e for k, e in self._data.items() if in_prefix(k, prefix)), key=_by_key)
        return entries, self._revision

    async def grant(self, ttl: float) -> Lease:
        self._check_open()
        lease = Lease(next(self._lease_ids), ttl)
        self._leases[lease.id] = _LeaseState(lease)
        self._arm(lease.id)
        return lease

    async def refresh(self, lease: Lease) -> None:
        self._check_open()
        if lease.id not in self._leases:
            raise LeaseExpiredError(f"lease {lease.id:x} has expired or was revoked")
        self._arm(lease.id)

    async def revoke(self, lease: Lease) -> None:
        self._check_open()
        self._end_lease(lease.id)

    @contextlib.asynccontextmanager
    async def _stream(self, watch: Watch, prefix: str, since: int | None) -> AsyncIterator[None]:
        oldest = self._replay[0].revision if self._replay else self._revision + 1
        if since is None or since + 1 < oldest:
            watch.lost()
        else:
            for event in self._replay:
                if event.revision > since:
                    watch.push(event)
        yield  # _publish pushes every later change into the open watches

    async def _close(self) -> None:
        for state in self._leases.values():
            if state.timer is not None:
                state.timer.cancel()
        self._leases.clear()

    def _check_expect(self, key: str, expect: int | None) -> None:
        if expect is None:
            return
        current = self._data.get(key)
        if current is None and expect != 0:
            raise KeyNotFoundError(key)
        actual = 0 if current is None else current.revision
        if actual != expect:
            raise RevisionMismatchError(key, expect, actual)

    def _bind(self, key: str, lease: Lease | None) -> None:
        old = self._key_lease.pop(key, None)
        if old is not None and old in self._leases:
            self._leases[old].keys.discard(key)
        if lease is not None:
            self._key_lease[key] = lease.id
            self._leases[lease.id].keys.add(key)

    def _remove(self, key: str) -> None:
        if key not in self._data:
            return
        del self._data[key]
        self._bind(key, None)
        self._revision += 1
        self._publish(Delete(key, self._revision))

    def _publish(self, event: Put | Delete) -> None:
        self._replay.append(event)
        for watch in self._watches:
            watch.push(event)

    def _arm(self, lease_id: int) -> None:
        state = self._leases[lease_id]
        if state.timer is not None:
            state.timer.cancel()
        loop = asyncio.get_running_loop()
        state.timer = loop.call_later(state.lease.ttl, self._end_lease, lease_id)

    def _end_lease(self, lease_id: int) -> None:
        state = self._leases.pop(lease_id, None)
        if state is None:
            return
        if state.timer is not None:
            state.timer.cancel()
        for key in sorted(state.keys):
            self._remove(key)


def _by_key(entry: Entry) -> str:
    return entry.key
