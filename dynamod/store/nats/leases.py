"""Leases on a store that has none: keys with per-message TTLs, kept alive by the store that
granted the lease (see "Leases" in the package docstring).

A ``Lease`` lives in the ``Leases`` of one store. Each key written with it carries ``Nats-TTL``
and a ``Dynamo-Lease`` header naming it; ``refresh`` re-publishes each such key with its
current value and the full TTL by compare-and-swap, so a rewrite by another process is kept.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
from dataclasses import dataclass, field
from typing import NoReturn

from dynamod.errors import LeaseExpiredError
from dynamod.store.base import Lease, LeaseArg
from dynamod.store.nats.bucket import CAS_ROUNDS, Bucket, conflict
from dynamod.store.nats.messages import DELETE, LEASE, TTL

log = logging.getLogger(__name__)


@dataclass
class Held:
    """What this store last wrote to one key of a lease (the refresh tries it first)."""

    seq: int
    value: bytes


@dataclass
class LeaseState:
    lease: Lease
    deadline: float
    keys: dict[str, Held] = field(default_factory=dict)

    @property
    def tag(self) -> str:
        return f"{self.lease.id:x}"


def lease_ttl(ttl: float) -> int:
    """NATS TTLs are whole seconds (fractions are truncated, 0 is refused): round up."""
    return max(1, math.ceil(ttl))


class Leases:
    """The leases one store granted and the keys bound to each. Calls that talk to NATS
    raise nats-py's errors; the store runs them under its call wrapper."""

    def __init__(self, bucket: Bucket) -> None:
        self._bucket = bucket
        self._states: dict[int, LeaseState] = {}

    def grant(self, ttl: float) -> Lease:
        lease = Lease(secrets.randbits(63) | 1, float(lease_ttl(ttl)))
        deadline = asyncio.get_running_loop().time() + lease.ttl
        self._states[lease.id] = LeaseState(lease, deadline)
        return lease

    def live(self, lease: Lease) -> LeaseState:
        """The state of ``lease``; ``LeaseExpiredError`` once it has ended."""
        state = self._states.get(lease.id)
        if state is None or asyncio.get_running_loop().time() >= state.deadline:
            self._states.pop(lease.id, None)
            raise LeaseExpiredError(f"lease {lease.id:x} has expired or was revoked")
        return state

    def headers(self, lease: LeaseArg) -> dict[str, str]:
        """The headers that bind a key written now to ``lease`` (none without a lease)."""
        if not isinstance(lease, Lease):
            return {}
        remaining = self._states[lease.id].deadline - asyncio.get_running_loop().time()
        return {TTL: str(lease_ttl(remaining)), LEASE: f"{lease.id:x}"}

    def rebind(self, key: str, tag: str | None, held: Held | None) -> None:
        """Record that ``key`` now belongs to the lease named by ``tag`` (or to none)."""
        for state in self._states.values():
            if state.tag == tag and held is not None:
                state.keys[key] = held
            else:
                state.keys.pop(key, None)

    async def refresh(self, lease: Lease) -> None:
        state = self.live(lease)
        started = asyncio.get_running_loop().time()
        for key in list(state.keys):
            await self._refresh_key(state, key)
        state.deadline = started + lease.ttl

    async def revoke(self, lease: Lease) -> None:
        # The lease ends here even if a delete below fails: such a key expires with its TTL.
        state = self._states.pop(lease.id, None)
        if state is not None:
            await self._drop_keys(state)

    def clear(self) -> None:
        self._states.clear()

    async def _refresh_key(self, state: LeaseState, key: str) -> None:
        """Re-publish one key of the lease with its current value and the full TTL."""
        subject, held = self._bucket.subject(key), state.keys[key]
        headers = {TTL: str(lease_ttl(state.lease.ttl)), LEASE: state.tag}
        for _ in range(CAS_ROUNDS):
            seq = await self._bucket.publish(subject, held.value, headers, last=held.seq)
            if seq is not None:
                state.keys[key] = Held(seq, held.value)
                return
            current = await self._bucket.read(subject)
            if current is None or not current.live:
                await self._expire(state, key)
            if current.headers.get(LEASE) != state.tag:
                del state.keys[key]  # its writer unbound it: no longer ours to refresh
                return
            held = Held(current.seq, current.value)
        raise conflict("refresh", key)

    async def _expire(self, state: LeaseState, key: str) -> NoReturn:
        """A key of the lease is gone, so the lease is: remove the rest, like etcd would."""
        self._states.pop(state.lease.id, None)
        del state.keys[key]
        await self._drop_keys(state)
        raise LeaseExpiredError(
            f"lease {state.lease.id:x} has expired: its key {key!r} is gone; register again"
        )

    async def _drop_keys(self, state: LeaseState) -> None:
        """Delete each key still bound to the lease (skipping any rebound meanwhile)."""
        for key, held in list(state.keys.items()):
            subject, seq = self._bucket.subject(key), held.seq
            for _ in range(CAS_ROUNDS):
                if await self._bucket.publish(subject, b"", DELETE, last=seq) is not None:
                    break
                current = await self._bucket.read(subject)
                if current is None or not current.live or current.headers.get(LEASE) != state.tag:
                    break
                seq = current.seq
            else:
                log.warning(
                    "key %r of lease %s not deleted; it expires with its TTL", key, state.tag
                )
        state.keys.clear()
