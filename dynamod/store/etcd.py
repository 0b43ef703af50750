"""The etcd backend: the contract of ``base`` on etcd v3, through aetcd 1.0.

This is the only module that talks to etcd. It uses aetcd for the channel and its generated
stubs, and builds the requests itself: aetcd's helpers cannot express ``ignore_lease``,
keep-alive once, or a watch stream whose life this store owns.

URL
    ``etcd://host:port[,host:port...][/prefix]``. The endpoints are tried in order when the
    store opens; the first that answers a linearizable read within the timeout is used.
    The optional prefix is a key namespace: store key ``a/b`` lives at etcd key
    ``<prefix>/a/b``, and keys outside it (or not in the key grammar) are never shown.
Revisions
    etcd's own: an entry's revision is the key's ``mod_revision``, a ``Delete`` carries the
    revision of the deletion, ``list`` answers with the response header's revision.
Compare-and-swap
    One transaction per conditional write, comparing ``mod_revision`` (``version == 0`` for
    create-only); its failure branch reads the key in the same transaction, so the actual
    revision in ``RevisionMismatchError`` is exact. ``lease=KEEP`` is ``ignore_lease``.
Leases
    Native etcd leases. etcd rounds a TTL up to whole seconds and to its minimum (2 s with
    default election settings); ``Lease.ttl`` is the TTL etcd granted.
Watches
    One gRPC watch stream per ``watch()``, fed by a task this store owns. A stream that
    breaks (etcd restart, compaction) is opened again from the current revision with capped
    exponential back-off, and only then is the watch told it lost events, so its ``Resync``
    (a ``list``) happens after the new stream exists: nothing falls in between. Resuming
    from the last revision seen would skip the snapshot, but not survive an etcd restored
    from a backup, where revisions go back.
Deadlines
    Every call carries the store's timeout as its gRPC deadline. UNAVAILABLE, deadlines and
    overload become ``StoreUnavailableError``; a dead peer on a quiet watch stream is found
    by gRPC keep-alive pings.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, Self
from urllib.parse import urlsplit

import aetcd
from aetcd import rpc

from dynamod.aio import cancel_and_wait
from dynamod.errors import (
    ConfigError,
    InvalidInputError,
    InvalidKeyError,
    KeyNotFoundError,
    LeaseExpiredError,
    RevisionMismatchError,
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
)
from dynamod.store.base import (
    DEFAULT_TIMEOUT,
    KEEP,
    Delete,
    Entry,
    Lease,
    LeaseArg,
    Put,
    Store,
    Watch,
    in_prefix,
    validate_key,
)

log = logging.getLogger(__name__)

DEFAULT_PORT: Final = 2379
BACKOFF_FIRST: Final = 0.05
BACKOFF_MAX: Final = 2.0

CHANNEL_OPTIONS: Final = {
    # gRPC's own reconnect back-off grows to 120 s; an etcd restart should cost seconds.
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 2000,
    # A watch stream can be quiet for hours: pings find a dead peer. etcd refuses pings
    # more often than every 5 s (--grpc-keepalive-min-time).
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
    "grpc.http2.max_pings_without_data": 0,
    # A list of many worker records can exceed gRPC's 4 MiB default.
    "grpc.max_receive_message_length": 256 * 1024 * 1024,
}

# Codes that mean "not now" rather than "never": the caller may retry.
_RETRYABLE: Final = frozenset(
    {
        rpc.StatusCode.UNAVAILABLE,
        rpc.StatusCode.DEADLINE_EXCEEDED,
        rpc.StatusCode.CANCELLED,
        rpc.StatusCode.RESOURCE_EXHAUSTED,
        rpc.StatusCode.ABORTED,
    }
)
_HOST = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")

# aetcd ships no type hints: its protobuf messages and gRPC calls are ``Any`` here.
Message = Any


@dataclass(frozen=True)
class EtcdTarget:
    """A parsed ``etcd://`` URL: endpoints in failover order and the key namespace."""

    endpoints: tuple[tuple[str, int], ...]
    root: str  # "" or "<prefix>/": prepended to every store key


def parse_url(url: str) -> EtcdTarget:
    """Parse ``etcd://host:port[,host:port...][/prefix]``; ``ConfigError`` names a bad one."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigError(f"etcd URL {url!r} does not parse: {exc}") from None
    if parts.scheme != "etcd" or not parts.netloc or parts.query or parts.fragment:
        raise ConfigError(
            f"etcd URL {url!r} is malformed; the form is etcd://host:port[,host:port...][/prefix]"
        )
    endpoints = tuple(_parse_endpoint(url, text) for text in parts.netloc.split(","))
    prefix = parts.path.removeprefix("/").removesuffix("/")
    if prefix:
        try:
            validate_key(prefix)
        except InvalidKeyError as exc:
            raise ConfigError(f"etcd URL {url!r} has an unusable key prefix: {exc}") from None
    return EtcdTarget(endpoints, f"{prefix}/" if prefix else "")


def _parse_endpoint(url: str, text: str) -> tuple[str, int]:
    host, port = text, str(DEFAULT_PORT)
    if not text.endswith("]") and ":" in text:
        host, _, port = text.rpartition(":")
    if not _HOST.fullmatch(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"etcd URL {url!r} has endpoint {text!r}; an endpoint is host[:port] with a "
            "port from 1 to 65535, and endpoints are separated by ','"
        )
    return host, int(port)


class _Backoff:
    """Capped exponential delays between attempts to reach etcd again; the first attempt
    after a reset goes at once."""

    def __init__(self) -> None:
        self._delay = 0.0

    def reset(self) -> None:
        self._delay = 0.0

    async def wait(self) -> None:
        await asyncio.sleep(self._delay)
        self._delay = min(max(self._delay * 2, BACKOFF_FIRST), BACKOFF_MAX)


class _Stream(NamedTuple):
    """One established etcd watch stream: the gRPC call and its response iterator."""

    call: Any
    responses: AsyncIterator[Message]


class EtcdStore(Store):
    def __init__(self, url: str, client: aetcd.Client, root: str) -> None:
        super().__init__(url)
        self._client = client
        self._root = root.encode()
        self._watch_stub = rpc.WatchStub(client.channel)
        self._feeds: set[asyncio.Task[None]] = set()

    @classmethod
    async def open(cls, url: str) -> Self:
        target = parse_url(url)
        client = await _connect(url, target.endpoints, DEFAULT_TIMEOUT)
        return cls(url, client, target.root)

    async def get(self, key: str) -> Entry | None:
        self._check_open()
        request = rpc.RangeRequest(key=self._raw(validate_key(key)))
        response = await self._unary(self._client.kvstub.Range, request, f"get {key!r}")
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
        request = _put_request(raw, value, lease, keep=False)
        response = await self._unary(self._client.kvstub.Put, request, what)
        return int(response.header.revision)

    async def delete(self, key: str, *, expect: int | None = None) -> None:
        self._check_open()
        raw = self._raw(validate_key(key))
        if expect is None:
            request = rpc.DeleteRangeRequest(key=raw)
            await self._unary(self._client.kvstub.DeleteRange, request, f"delete {key!r}")
            return
        op = rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=raw))
        await self._guarded(key, expect, op, f"delete {key!r}")

    async def list(self, prefix: str) -> tuple[list[Entry], int]:
        self._check_open()
        start, end = self._span(validate_key(prefix, prefix=True))
        # etcd's byte order is store-key order: one namespace, ASCII keys.
        request = rpc.RangeRequest(key=start, range_end=end, sort_order=rpc.RangeRequest.ASCEND)
        response = await self._unary(self._client.kvstub.Range, request, f"list {prefix!r}")
        entries = [self._entry(kv) for kv in response.kvs]
        return [e for e in entries if e and in_prefix(e.key, prefix)], int(response.header.revision)

    async def grant(self, ttl: float) -> Lease:
        self._check_open()
        if not ttl > 0:
            raise InvalidInputError(f"lease TTL {ttl!r} is not a positive number of seconds")
        request = rpc.LeaseGrantRequest(TTL=math.ceil(ttl))
        response = await self._unary(self._client.leasestub.LeaseGrant, request, "grant a lease")
        if response.error:
            raise StoreError(f"etcd at {self.url} refused a lease of {ttl} s: {response.error}")
        return Lease(int(response.ID), float(response.TTL))

    async def refresh(self, lease: Lease) -> None:
        self._check_open()
        ttl = 0
        with self._calling(f"refresh lease {lease.id:x}"):
            # One keep-alive: the stream ends once etcd has answered our only request.
            call = self._client.leasestub.LeaseKeepAlive(
                [rpc.LeaseKeepAliveRequest(ID=lease.id)],
                timeout=self.timeout,
                metadata=self._client.metadata,
            )
            async for reply in call:
                ttl = int(reply.TTL)
        if ttl <= 0:
            raise LeaseExpiredError(f"lease {lease.id:x} has expired or was revoked")

    async def revoke(self, lease: Lease) -> None:
        self._check_open()
        request = rpc.LeaseRevokeRequest(ID=lease.id)
        try:
            await self._unary(
                self._client.leasestub.LeaseRevoke, request, f"revoke lease {lease.id:x}"
            )
        except LeaseExpiredError:
            pass  # already gone: what revoking asks for

    @contextlib.asynccontextmanager
    async def _feed(self, watch: Watch, prefix: str, since: int | None) -> AsyncIterator[None]:
        span = self._span(prefix)
        # Revision 0 would mean "from now" to etcd: a replay from before the first
        # revision starts at 1 instead.
        stream = await self._subscribe(span, None if since is None else max(since + 1, 1))
        if since is None:
            watch.lost()
        task = asyncio.create_task(self._pump(watch, span, stream), name=f"etcd watch {prefix!r}")
        self._feeds.add(task)
        try:
            yield
        finally:
            try:
                await cancel_and_wait(task)  # raises what the feed ended with, if not cancelled
            finally:
                self._feeds.discard(task)  # it has ended: cancel_and_wait waited for that

    async def _close(self) -> None:
        feeds = set(self._feeds)
        for task in feeds:
            task.cancel()
        if feeds:
            await asyncio.wait(feeds)
        await self._client.close()

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

    async def _guarded(self, key: str, expect: int, op: Message, what: str) -> int:
        """Apply ``op`` only if ``key`` is at revision ``expect`` (0: absent)."""
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
        response = await self._unary(self._client.kvstub.Txn, request, what)
        if response.succeeded:
            return int(response.header.revision)
        found = response.responses[0].response_range.kvs
        if not found:
            raise KeyNotFoundError(key)
        raise RevisionMismatchError(key, expect, int(found[0].mod_revision))

    async def _put_keeping_lease(self, raw: bytes, value: bytes, what: str) -> int:
        """``put(lease=KEEP)``: etcd refuses ``ignore_lease`` on a missing key, so a
        transaction picks ``ignore_lease`` when the key exists and no lease otherwise."""
        exists = rpc.Compare(
            key=raw, target=rpc.Compare.VERSION, result=rpc.Compare.GREATER, version=0
        )
        request = rpc.TxnRequest(
            compare=[exists],
            success=[_put_op(raw, value, KEEP, keep=True)],
            failure=[_put_op(raw, value, None, keep=False)],
        )
        response = await self._unary(self._client.kvstub.Txn, request, what)
        return int(response.header.revision)

    # -- watches -------------------------------------------------------------------------

    async def _subscribe(self, span: tuple[bytes, bytes], start: int | None) -> _Stream:
        """Open a watch stream on ``span`` from revision ``start`` (None: from now) and
        return once etcd confirmed it: every later change will come through it."""
        create = rpc.WatchCreateRequest(key=span[0], range_end=span[1], start_revision=start or 0)
        call = self._watch_stub.Watch(metadata=self._client.metadata)
        try:
            with self._calling("open a watch"):
                async with asyncio.timeout(self.timeout):
                    await call.write(rpc.WatchRequest(create_request=create))
                    responses = aiter(call)
                    created = await anext(responses, None)
            if created is None or not created.created or created.canceled:
                reason = "" if created is None else created.cancel_reason
                raise StoreUnavailableError(f"etcd at {self.url} ended a new watch: {reason}")
        except BaseException:
            call.cancel()
            raise
        return _Stream(call, responses)

    async def _pump(self, watch: Watch, span: tuple[bytes, bytes], stream: _Stream) -> None:
        """Feed ``watch`` from ``stream``, and from a new stream each time one ends."""
        backoff = _Backoff()
        try:
            while True:
                if await self._forward(stream, watch):
                    backoff.reset()  # that stream worked; a stream etcd ends at once does not
                stream = await self._resubscribe(span, backoff)
                watch.lost()
        except StoreClosedError:
            return
        finally:
            watch.close()  # however the feed ends, the consumer stops waiting for it

    async def _forward(self, stream: _Stream, watch: Watch) -> bool:
        """Push the stream's events until etcd ends it (error, restart, compaction);
        return whether anything came through."""
        received = False
        try:
            with self._calling("watch"):
                async for response in stream.responses:
                    if response.canceled:
                        log.warning(
                            "etcd ended a watch on %s (compact revision %d, reason %r)",
                            self.url,
                            response.compact_revision,
                            response.cancel_reason,
                        )
                        break
                    received = True
                    for event in response.events:
                        self._push(watch, event)
        except StoreUnavailableError as exc:
            log.warning("a watch stream broke: %s", exc)
        finally:
            stream.call.cancel()
        return received

    def _push(self, watch: Watch, event: Message) -> None:
        entry = self._entry(event.kv)
        if entry is None:
            return
        if event.type == rpc.Event.DELETE:
            watch.push(Delete(entry.key, entry.revision))
        else:
            watch.push(Put(entry))

    async def _resubscribe(self, span: tuple[bytes, bytes], backoff: _Backoff) -> _Stream:
        """Open the stream again from now, waiting longer after each failure."""
        failures = 0
        while True:
            await backoff.wait()
            try:
                stream = await self._subscribe(span, None)
            except StoreUnavailableError as exc:
                level = logging.DEBUG if failures else logging.WARNING
                log.log(level, "cannot watch again yet, retrying: %s", exc)
                failures += 1
                continue
            if failures:
                log.info("watch on %s re-established after %d failed attempts", self.url, failures)
            return stream

    # -- calls ---------------------------------------------------------------------------

    async def _unary(
        self, method: Callable[..., Awaitable[Message]], request: Message, what: str
    ) -> Message:
        with self._calling(what):
            return await method(request, timeout=self.timeout, metadata=self._client.metadata)

    @contextlib.contextmanager
    def _calling(self, what: str) -> Iterator[None]:
        """Run one etcd call: gRPC errors and deadlines come out as ours."""
        self._check_open()
        try:
            yield
        except rpc.AioRpcError as exc:
            raise self._translate(exc, what) from None
        except TimeoutError:
            raise StoreUnavailableError(
                f"etcd at {self.url} did not {what} within {self.timeout} s"
            ) from None
        except asyncio.CancelledError:
            # Closing the channel cancels its calls: that is aclose() under us, not a
            # cancellation of this task, which would show in cancelling().
            task = asyncio.current_task()
            if self._closed and task is not None and not task.cancelling():
                raise StoreClosedError(f"store {self.url} was closed during {what}") from None
            raise

    def _translate(self, exc: rpc.AioRpcError, what: str) -> StoreError:
        code, details = exc.code(), exc.details()
        if self._closed:
            return StoreClosedError(f"store {self.url} was closed during {what}")
        if code in _RETRYABLE:
            return StoreUnavailableError(
                f"etcd at {self.url} could not {what}: {details} ({code.name})"
            )
        if code == rpc.StatusCode.NOT_FOUND and "lease" in details:
            return LeaseExpiredError(f"cannot {what}: the lease has expired or was revoked")
        return StoreError(f"etcd at {self.url} refused to {what}: {details} ({code.name})")


def _put_request(raw: bytes, value: bytes, lease: LeaseArg, *, keep: bool) -> Message:
    lease_id = lease.id if isinstance(lease, Lease) else 0
    return rpc.PutRequest(key=raw, value=bytes(value), lease=lease_id, ignore_lease=keep)


def _put_op(raw: bytes, value: bytes, lease: LeaseArg, *, keep: bool) -> Message:
    return rpc.RequestOp(request_put=_put_request(raw, value, lease, keep=keep))


async def _connect(
    url: str, endpoints: tuple[tuple[str, int], ...], per_endpoint: float
) -> aetcd.Client:
    """A client on the first endpoint that answers a linearizable read (so its cluster has
    a leader) within ``per_endpoint`` seconds; else ``StoreUnavailableError`` listing why
    each endpoint failed."""
    failures = []
    for host, port in endpoints:
        client = aetcd.Client(host, port, options=CHANNEL_OPTIONS)
        try:
            await client.connect()
            probe = rpc.RangeRequest(key=b"\0", count_only=True)
            await client.kvstub.Range(probe, timeout=per_endpoint, metadata=client.metadata)
            return client
        except rpc.AioRpcError as exc:
            failures.append(f"{host}:{port}: {exc.details()} ({exc.code().name})")
            await client.close()
        except BaseException:
            await client.close()
            raise
    raise StoreUnavailableError(
        f"no etcd endpoint of {url!r} answered within {per_endpoint} s: " + "; ".join(failures)
    )
