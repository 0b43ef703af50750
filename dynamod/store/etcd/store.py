"""``EtcdStore``: the contract's calls on etcd v3 (see the package docstring for the design).

Each call is one request built here and run by ``Members.call`` on the member in use;
whether it may be sent to another member after the first broke under it is decided per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Sequence
from typing import Any, Self

from aetcd import rpc

from dynamod.errors import (
    InvalidInputError,
    InvalidKeyError,
    KeyNotFoundError,
    LeaseExpiredError,
    RevisionMismatchError,
    StoreError,
)
from dynamod.store.base import (
    DEFAULT_TIMEOUT,
    KEEP,
    Entry,
    Guard,
    Lease,
    LeaseArg,
    Store,
    Swap,
    Watch,
    check_swaps,
    guard_lost,
    in_prefix,
    validate_key,
)
from dynamod.store.etcd.members import Member, Members
from dynamod.store.etcd.url import EtcdUrl, parse_url
from dynamod.store.etcd.watches import WatchStream
from dynamod.tasks import cancel_and_wait

Message = Any  # aetcd ships no type hints: its protobuf messages are ``Any`` here
REFRESH_SHARE = 0.25
"""A refresh waits at most this share of the lease's TTL on one member, so that after a
member stops answering there is time left to refresh on another before the lease ends."""
MAX_SWAPS = 64
"""Keys one ``swap_all`` writes: its transaction holds one compare, one put and one read
per key (and one compare and one read of the guard), within etcd's default
``--max-txn-ops`` of 128 for each of compare, success and failure."""


class EtcdStore(Store):
    """The discovery store on etcd (see the package docstring)."""

    def __init__(self, target: EtcdUrl, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self._root = target.root.encode()
        self._members = Members(target, timeout, self._probe())
        super().__init__(target.url, timeout=timeout)
        self._streams: set[asyncio.Task[None]] = set()

    @classmethod
    async def open(cls, url: str, *, timeout: float = DEFAULT_TIMEOUT) -> Self:  # noqa: ASYNC109
        store = cls(parse_url(url), timeout=timeout)
        return await store._ready(store._members.open())

    @classmethod
    def check_url(cls, url: str) -> None:
        parse_url(url).check()

    @property
    def timeout(self) -> float:
        """The deadline of every call, kept by the members, which run the calls."""
        return self._members.timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self._members.timeout = value

    async def get(self, key: str) -> Entry | None:
        self._check_open()
        request = rpc.RangeRequest(key=self._raw(validate_key(key)))
        response = await self._call(f"get {key!r}", "Range", request, retry=True)
        return self._entry(response.kvs[0]) if response.kvs else None

    async def put(
        self, key: str, value: bytes, *, expect: int | None = None, lease: LeaseArg = None
    ) -> int:
        self._check_open()
        raw = self._raw(validate_key(key))
        what = f"put {key!r}" + (f" with lease {lease.id:x}" if isinstance(lease, Lease) else "")
        if expect is not None:
            op = _put_op(raw, value, lease, keep=lease == KEEP and expect != 0)
            return await self._guarded(key, expect, op, what)
        if lease == KEEP:
            return await self._put_keeping_lease(raw, value, what)
        # Writing the same value twice leaves the same state: safe to send again.
        request = _put_request(raw, value, lease, keep=False)
        response = await self._call(what, "Put", request, retry=True)
        return int(response.header.revision)

    async def delete(self, key: str, *, expect: int | None = None) -> None:
        self._check_open()
        raw = self._raw(validate_key(key))
        if expect is None:
            request = rpc.DeleteRangeRequest(key=raw)
            await self._call(f"delete {key!r}", "DeleteRange", request, retry=True)
            return
        op = rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=raw))
        await self._guarded(key, expect, op, f"delete {key!r}")

    async def list(self, prefix: str) -> tuple[list[Entry], int]:
        self._check_open()
        start, end = self._span(validate_key(prefix, prefix=True))
        # etcd's byte order is store-key order: one namespace, ASCII keys.
        request = rpc.RangeRequest(key=start, range_end=end, sort_order=rpc.RangeRequest.ASCEND)
        response = await self._call(f"list {prefix!r}", "Range", request, retry=True)
        entries = [self._entry(kv) for kv in response.kvs]
        return [e for e in entries if e and in_prefix(e.key, prefix)], int(response.header.revision)

    async def grant(self, ttl: float) -> Lease:
        self._check_open()
        if not ttl > 0:
            raise InvalidInputError(f"lease TTL {ttl!r} is not a positive number of seconds")
        request = rpc.LeaseGrantRequest(TTL=math.ceil(ttl))

        async def grant(member: Member, seconds: float) -> Message:
            return await member.lease.LeaseGrant(request, timeout=seconds, metadata=member.metadata)

        # A lease granted twice leaves one unused, which ends with its TTL.
        response = await self._members.call("grant a lease", grant, retry=True)
        if response.error:
            raise StoreError(f"etcd at {self.url} refused a lease of {ttl} s: {response.error}")
        return Lease(int(response.ID), float(response.TTL))

    async def refresh(self, lease: Lease) -> None:
        self._check_open()

        async def keep_alive_once(member: Member, seconds: float) -> int:
            # One keep-alive: the stream ends once etcd has answered our only request.
            call = member.lease.LeaseKeepAlive(
                [rpc.LeaseKeepAliveRequest(ID=lease.id)], timeout=seconds, metadata=member.metadata
            )
            ttl = 0
            async for reply in call:
                ttl = int(reply.TTL)
            return ttl

        attempt = max(lease.ttl * REFRESH_SHARE, 0.1)
        what = f"refresh lease {lease.id:x}"
        ttl = await self._members.call(what, keep_alive_once, retry=True, attempt=attempt)
        if ttl <= 0:
            raise LeaseExpiredError(f"lease {lease.id:x} has expired or was revoked")

    async def revoke(self, lease: Lease) -> None:
        self._check_open()
        request = rpc.LeaseRevokeRequest(ID=lease.id)

        async def revoke(member: Member, seconds: float) -> Message:
            return await member.lease.LeaseRevoke(
                request, timeout=seconds, metadata=member.metadata
            )

        try:
            await self._members.call(f"revoke lease {lease.id:x}", revoke, retry=True)
        except LeaseExpiredError:
            pass  # already gone: what revoking asks for

    @contextlib.asynccontextmanager
    async def _stream(self, watch: Watch, prefix: str, since: int | None) -> AsyncIterator[None]:
        feed = WatchStream(self._members, watch, self._span(prefix), self._entry)
        stream, position = await feed.start(since)
        task = asyncio.create_task(feed.run(stream, position), name=f"etcd watch {prefix!r}")
        self._streams.add(task)
        try:
            yield
        finally:
            try:
                await cancel_and_wait(task)  # raises what the feed ended with, if not cancelled
            finally:
                self._streams.discard(task)  # it has ended: cancel_and_wait waited for that

    async def _close(self) -> None:
        streams = set(self._streams)
        for task in streams:
            task.cancel()
        if streams:
            await asyncio.wait(streams)
        await self._members.close()

    # -- keys ----------------------------------------------------------------------------

    def _raw(self, key: str) -> bytes:
        return self._root + key.encode()

    def _span(self, prefix: str) -> tuple[bytes, bytes]:
        """The etcd key range holding ``prefix``; callers still filter with ``in_prefix``."""
        if prefix:
            start = self._raw(prefix)
            return start, start + b"0"  # '0' follows '/': the key, its children, a few siblings
        if self._root:
            return self._root, self._root[:-1] + b"0"
        return b"\0", b"\0"  # etcd's "every key"

    def _probe(self) -> Message:
        """The read that tells a member serves: one linearizable count in our namespace
        (a user may be allowed nothing else)."""
        start, end = self._span("")
        return rpc.RangeRequest(key=start, range_end=end, count_only=True)

    def _key(self, raw: bytes) -> str | None:
        """The store key of etcd key ``raw``, or None for a key that is not ours."""
        if not raw.startswith(self._root):
            return None
        try:
            return validate_key(raw[len(self._root) :].decode())
        except (UnicodeDecodeError, InvalidKeyError):
            return None  # written by another program into our namespace

    def _entry(self, kv: Message) -> Entry | None:
        key = self._key(kv.key)
        return None if key is None else Entry(key, bytes(kv.value), int(kv.mod_revision))

    # -- writes --------------------------------------------------------------------------

    max_swaps = MAX_SWAPS

    async def swap_all(self, swaps: Sequence[Swap], *, guard: Guard | None = None) -> int:
        """One transaction: a compare of each key's revision (and of the guard's), a put
        keeping its lease for each, and on failure a read of each (the guard's first), to
        name the first that differs."""
        self._check_open()
        check_swaps(swaps, guard, MAX_SWAPS)
        raws = [self._raw(s.key) for s in swaps]
        pairs = list(zip(raws, swaps, strict=True))
        compare = [_at(raw, swap.expect) for raw, swap in pairs]
        reads = list(raws)
        if guard is not None:
            compare.insert(0, _at(self._raw(guard.key), guard.revision))
            reads.insert(0, self._raw(guard.key))
        request = rpc.TxnRequest(
            compare=compare,
            success=[_put_op(raw, swap.value, KEEP, keep=True) for raw, swap in pairs],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=raw)) for raw in reads],
        )
        what = f"swap {len(swaps)} keys from {swaps[0].key!r}"
        response = await self._call(what, "Txn", request, retry=False)
        if response.succeeded:
            return int(response.header.revision)
        found = [read.response_range.kvs for read in response.responses]
        if guard is not None:
            held = found.pop(0)
            actual = int(held[0].mod_revision) if held else 0
            if actual != guard.revision:
                raise guard_lost(guard, actual)
        for swap, kvs in zip(swaps, found, strict=True):
            if not kvs:
                raise KeyNotFoundError(swap.key)
            if int(kvs[0].mod_revision) != swap.expect:
                raise RevisionMismatchError(swap.key, swap.expect, int(kvs[0].mod_revision))
        raise RevisionMismatchError(swaps[0].key, swaps[0].expect, 0)  # changed and back

    async def _guarded(self, key: str, expect: int, op: Message, what: str) -> int:
        """Apply ``op`` only if ``key`` is at revision ``expect`` (0: absent).

        Not sent again after a member broke under it: had the first applied, the second
        would report a mismatch for a change that was made.
        """
        raw = self._raw(key)
        if expect == 0:
            compare = rpc.Compare(
                key=raw, target=rpc.Compare.VERSION, result=rpc.Compare.EQUAL, version=0
            )
        else:
            compare = rpc.Compare(
                key=raw, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL, mod_revision=expect
            )
        read = rpc.RequestOp(request_range=rpc.RangeRequest(key=raw))
        request = rpc.TxnRequest(compare=[compare], success=[op], failure=[read])
        response = await self._call(what, "Txn", request, retry=False)
        if response.succeeded:
            return int(response.header.revision)
        found = response.responses[0].response_range.kvs
        if not found:
            raise KeyNotFoundError(key)
        raise RevisionMismatchError(key, expect, int(found[0].mod_revision))

    async def _put_keeping_lease(self, raw: bytes, value: bytes, what: str) -> int:
        """``put(lease=KEEP)``: etcd refuses ``ignore_lease`` on a missing key, so a
        transaction picks ``ignore_lease`` when the key exists and no lease otherwise.
        Sent again after a broken member: either branch leaves the same state."""
        exists = rpc.Compare(
            key=raw, target=rpc.Compare.VERSION, result=rpc.Compare.GREATER, version=0
        )
        request = rpc.TxnRequest(
            compare=[exists],
            success=[_put_op(raw, value, KEEP, keep=True)],
            failure=[_put_op(raw, value, None, keep=False)],
        )
        response = await self._call(what, "Txn", request, retry=True)
        return int(response.header.revision)

    async def _call(self, what: str, method: str, request: Message, *, retry: bool) -> Message:
        """One unary KV request (``Range``, ``Put``, ``DeleteRange``, ``Txn``)."""

        async def invoke(member: Member, seconds: float) -> Message:
            call = getattr(member.kv, method)
            return await call(request, timeout=seconds, metadata=member.metadata)

        return await self._members.call(what, invoke, retry=retry)


def _put_request(raw: bytes, value: bytes, lease: LeaseArg, *, keep: bool) -> Message:
    lease_id = lease.id if isinstance(lease, Lease) else 0
    return rpc.PutRequest(key=raw, value=bytes(value), lease=lease_id, ignore_lease=keep)


def _at(raw: bytes, revision: int) -> Message:
    return rpc.Compare(
        key=raw, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL, mod_revision=revision
    )


def _put_op(raw: bytes, value: bytes, lease: LeaseArg, *, keep: bool) -> Message:
    return rpc.RequestOp(request_put=_put_request(raw, value, lease, keep=keep))
