"""The NATS JetStream KV backend: the contract of ``base`` on one KV bucket, through nats-py.

This is the only module that talks to NATS. It uses nats-py for the connection and the
JetStream API, and publishes and consumes the bucket's stream itself: the KV helpers drop a
key's TTL on update (``put``/``update`` have no TTL), treat an expiry marker as a value, and
their watcher stalls for ~14 s after a server restart.

URL
    ``nats://[user:password@]host[:port][,host[:port]...][/bucket]`` (port 4222, bucket
    ``dynamo`` by default). The bucket is created with history 1, per-message TTL and expiry
    markers; an existing bucket gains the last two in place, one with history > 1 is refused
    (an expiring key would reveal its older value). Needs nats-server 2.11 or newer.
Keys
    ``/`` becomes the subject separator ``.``, and ``.`` inside a segment becomes ``=``
    (legal in NATS keys, illegal in ours, so the mapping is reversible). A prefix ``a/b``
    is the filter pair ``a.b`` + ``a.b.>``, which never matches ``a.bc``.
Revisions
    The stream sequence. Writes that compare publish with
    ``Nats-Expected-Last-Subject-Sequence`` after a read of the key's last message: a
    delete tombstone or an expiry marker is *absent* for us (create works over it, ``expect=N``
    on it is ``KeyNotFoundError``), which the server's check alone cannot tell. So a create
    of a fresh key costs one round trip and any other compare-and-swap two.
Leases
    NATS has none: a ``Lease`` lives in the store that granted it. A key written with it is
    published with ``Nats-TTL`` (the lease's remaining time, whole seconds, at least 1) and
    a ``Dynamo-Lease`` header naming it; ``refresh`` re-publishes each of its keys with its
    current value by compare-and-swap and the full TTL, re-reading on a conflict so that a
    rewrite by another process is kept, never clobbered. ``lease=KEEP`` copies both headers
    from the current message, so such a rewrite restarts that key's TTL but keeps it bound.
    A key of the lease that is gone ends the lease (``LeaseExpiredError``); a key rewritten
    without the lease's header was unbound by its writer and is no longer refreshed.
    Expiry reaches watchers as the server's marker; markers live ``MARKER_TTL`` seconds,
    our own delete tombstones until the key is written again.
Watches
    One push consumer per ``watch()`` (memory storage, no acks, idle heartbeats), fed into
    the watch by a task this store owns. With ``since`` the consumer starts at ``since + 1``;
    history is one message per key, so this replay is *compacted*: it holds the latest
    change of each key after ``since``, in store order, ending at the true state. It is used
    only while no expiry marker after ``since`` can have aged out (judged by message times
    against ``MARKER_TTL / 2``, leaving room for clock skew); otherwise the watch starts
    with a ``Resync``. A disconnect, a reconnect, a missed heartbeat or a gap in the
    consumer sequence closes the consumer; a new one is made once connected, and only then
    is the watch told it lost events, so its ``Resync`` happens after the stream exists.
Deadlines
    Every call runs under the store's timeout. A call made while the connection is down
    fails at once, and a call in flight when it drops fails as soon as the client notices:
    both are ``StoreUnavailableError``, whose outcome for a write is unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import math
import re
import secrets
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Final, NoReturn, Self
from urllib.parse import urlsplit

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api

from dynamod.aio import cancel_and_wait
from dynamod.errors import (
    ConfigError,
    ConflictError,
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
    WATCH_QUEUE,
    Delete,
    Entry,
    Lease,
    LeaseArg,
    Put,
    Store,
    Watch,
    validate_key,
)

log = logging.getLogger(__name__)

DEFAULT_PORT: Final = 4222
DEFAULT_BUCKET: Final = "dynamo"
MARKER_TTL: Final = 900
"""Seconds a server expiry marker stays in a bucket this store creates."""
HEARTBEAT: Final = 2.0
"""Idle heartbeat of a watch consumer; two missed ones mean the consumer is gone."""
INACTIVE: Final = 30.0
"""The server removes a consumer nobody listens to after this long (a crashed client)."""
RECONNECT_WAIT: Final = 0.5
PING_INTERVAL: Final = 5
CLEANUP_TIMEOUT: Final = 1.0
BACKOFF_FIRST: Final = 0.05
BACKOFF_MAX: Final = 2.0
ATTEMPTS: Final = 16
"""Compare-and-swap rounds of one call before it gives up with ``ConflictError``."""

_BUCKET = re.compile(r"[A-Za-z0-9_-]+")
_HOST = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")
_WRONG_LAST: Final = frozenset({10071, 10164})
_NO_MESSAGE: Final = 10037
_STREAM_IN_USE: Final = 10058
OPERATION: Final = "KV-Operation"
MARKER: Final = "Nats-Marker-Reason"
TTL: Final = "Nats-TTL"
LEASE: Final = "Dynamo-Lease"
EXPECT: Final = "Nats-Expected-Last-Subject-Sequence"
_DELETE: Final = {OPERATION: "DEL"}
_LOST: Final = "the connection to NATS was lost"
_BACK: Final = "reconnected to NATS"


# -- URL and key mapping ---------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where a ``nats://`` URL points. ``login`` (``user:password`` or a token) is kept out
    of ``url`` and of the repr, so it never reaches a log line or an error message."""

    hosts: tuple[str, ...]
    bucket: str
    login: str = field(default="", repr=False)

    @property
    def servers(self) -> list[str]:
        """Server URLs for the client, credentials included."""
        login = f"{self.login}@" if self.login else ""
        return [f"nats://{login}{host}" for host in self.hosts]

    @property
    def url(self) -> str:
        """The store URL to show: canonical, without credentials."""
        return f"nats://{','.join(self.hosts)}/{self.bucket}"


def parse_url(url: str) -> Target:
    """Split a store URL into servers and bucket; ``ConfigError`` names what is wrong."""
    parts = urlsplit(url)
    shown = url.replace(parts.netloc, parts.netloc.rpartition("@")[2])
    if parts.scheme != "nats" or parts.query or parts.fragment:
        raise ConfigError(
            f"store URL {shown!r} is not of the form nats://host[:port][,host[:port]...][/bucket]"
        )
    login, _, hosts = parts.netloc.rpartition("@")
    servers = tuple(_host_port(shown, item) for item in hosts.split(","))
    bucket = parts.path.strip("/") or DEFAULT_BUCKET
    if not _BUCKET.fullmatch(bucket):
        raise ConfigError(
            f"store URL {shown!r} names bucket {bucket!r}; a bucket name is letters, digits, "
            "'-' and '_'"
        )
    return Target(servers, bucket, login)


def _host_port(url: str, item: str) -> str:
    host, colon, port = item.rpartition(":")
    if not colon or host.endswith(":"):  # no port, or a bare IPv6 address
        host, port = item, str(DEFAULT_PORT)
    if not _HOST.fullmatch(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"store URL {url!r} has server {item!r}; a server is host[:port] with a port "
            "from 1 to 65535"
        )
    return f"{host}:{port}"


def encode_key(key: str) -> str:
    """Store key (or prefix) → NATS key: ``.`` → ``=``, then ``/`` → ``.``."""
    return key.replace(".", "=").replace("/", ".")


def decode_key(token: str) -> str:
    """The inverse of ``encode_key``."""
    return token.replace(".", "/").replace("=", ".")


def subject_filters(root: str, prefix: str) -> list[str]:
    """Subjects under ``root`` (``$KV.<bucket>.``) that match ``prefix`` on segment bounds."""
    if not prefix:
        return [f"{root}>"]
    base = root + encode_key(prefix)
    return [base, f"{base}.>"]


# -- messages ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Message:
    """The last message of one key's subject: a value, a tombstone or an expiry marker."""

    seq: int
    value: bytes
    headers: Mapping[str, str]

    @property
    def live(self) -> bool:
        return not is_tombstone(self.headers)


def is_tombstone(headers: Mapping[str, str]) -> bool:
    """Whether a message removes its key: our DEL, a KV PURGE, or a server marker."""
    return MARKER in headers or headers.get(OPERATION) in ("DEL", "PURGE")


def _check_expect(key: str, expect: int | None, current: _Message | None) -> None:
    """The contract's ``expect`` rules against the key's current message."""
    if expect is None:
        return
    actual = current.seq if current is not None and current.live else 0
    if expect and not actual:
        raise KeyNotFoundError(key)
    if actual != expect:
        raise RevisionMismatchError(key, expect, actual)


def _kept_headers(current: _Message | None) -> dict[str, str]:
    """``lease=KEEP``: the TTL and lease headers of the current value, if it has them."""
    if current is None or not current.live:
        return {}
    return {name: current.headers[name] for name in (TTL, LEASE) if name in current.headers}


# -- leases -----------------------------------------------------------------------------------


@dataclass
class _Held:
    """What this store last wrote to one key of a lease (the refresh tries it first)."""

    seq: int
    value: bytes


@dataclass
class _LeaseState:
    lease: Lease
    deadline: float
    keys: dict[str, _Held] = field(default_factory=dict)

    @property
    def tag(self) -> str:
        return f"{self.lease.id:x}"


def _lease_ttl(ttl: float) -> int:
    """NATS TTLs are whole seconds (fractions are truncated, 0 is refused): round up."""
    return max(1, math.ceil(ttl))


# -- consumers --------------------------------------------------------------------------------


@dataclass(eq=False)
class _Stream:
    """One push consumer and the local subscription it delivers to.

    The subscription's callback queues messages; connection changes queue a reason string,
    so the task reading the queue sees data and trouble in one order.
    """

    sub: Subscription
    inbox: asyncio.Queue[Msg | str]
    consumer: str = ""
    pending: int = 0
    delivered: int = 0

    def signal(self, reason: str) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self.inbox.put_nowait(reason)


class NatsStore(Store):
    """The discovery store on a NATS JetStream KV bucket (see the module docstring)."""

    def __init__(self, target: Target, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        super().__init__(target.url, timeout=timeout)  # shown in messages: no credentials
        self._target = target
        self._stream_name = f"KV_{target.bucket}"
        self._root = f"$KV.{target.bucket}."
        self._nc = Client()
        self._js: JetStreamContext = self._nc.jetstream(timeout=timeout)
        self._connected = asyncio.Event()
        self._deadlines: set[asyncio.Timeout] = set()
        self._streams: set[_Stream] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._leases: dict[int, _LeaseState] = {}
        self._marker_ttl: float = MARKER_TTL

    @classmethod
    async def open(cls, url: str, *, call_timeout: float = DEFAULT_TIMEOUT) -> Self:
        """Connect and prepare the bucket; ``call_timeout`` bounds this and every call."""
        store = cls(parse_url(url), timeout=call_timeout)
        try:
            await store._connect()
        except BaseException:
            await store.aclose()
            raise
        return store

    # -- the contract -------------------------------------------------------------------------

    async def get(self, key: str) -> Entry | None:
        subject = self._subject(key)
        async with self._call("get"):
            current = await self._read(subject)
        if current is None or not current.live:
            return None
        return Entry(key, current.value, current.seq)

    async def put(
        self, key: str, value: bytes, *, expect: int | None = None, lease: LeaseArg = None
    ) -> int:
        subject, value = self._subject(key), bytes(value)
        async with self._call("put"):
            if isinstance(lease, Lease):
                self._live_lease(lease)
            if expect is None and lease != KEEP:
                headers = self._lease_headers(lease)
                seq = await self._publish(subject, value, headers, last=None)
                assert seq is not None  # nothing to conflict with
            else:
                seq, headers = await self._put_checked(key, subject, value, expect, lease)
        self._rebind(key, headers.get(LEASE), _Held(seq, value))
        return seq

    async def delete(self, key: str, *, expect: int | None = None) -> None:
        subject = self._subject(key)
        async with self._call("delete"):
            current = await self._read(subject)
            for _ in range(ATTEMPTS):
                _check_expect(key, expect, current)
                if current is None or not current.live:
                    break
                if await self._publish(subject, b"", _DELETE, last=current.seq) is not None:
                    break
                current = await self._read(subject)
            else:
                raise self._conflict("delete", key)
        self._rebind(key, None, None)

    async def list(self, prefix: str) -> tuple[list[Entry], int]:
        validate_key(prefix, prefix=True)
        async with self._call("list"):
            floor = (await self._js.stream_info(self._stream_name)).state.last_seq
            entries, last = await self._snapshot(prefix)
        return sorted(entries.values(), key=_by_key), max(floor, last)

    async def grant(self, ttl: float) -> Lease:
        self._check_open()
        lease = Lease(secrets.randbits(63) | 1, float(_lease_ttl(ttl)))
        deadline = asyncio.get_running_loop().time() + lease.ttl
        self._leases[lease.id] = _LeaseState(lease, deadline)
        return lease

    async def refresh(self, lease: Lease) -> None:
        async with self._call("refresh"):
            state = self._live_lease(lease)
            started = asyncio.get_running_loop().time()
            for key in list(state.keys):
                await self._refresh_key(state, key)
            state.deadline = started + lease.ttl

    async def revoke(self, lease: Lease) -> None:
        # The lease ends here even if a delete below fails: such a key expires with its TTL.
        async with self._call("revoke"):
            state = self._leases.pop(lease.id, None)
            if state is not None:
                await self._drop_keys(state)

    @contextlib.asynccontextmanager
    async def _feed(self, watch: Watch, prefix: str, since: int | None) -> AsyncIterator[None]:
        async with self._call("watch"):
            replay = since is not None and await self._replay_is_complete(since)
            start = since + 1 if replay and since is not None else None
            stream = await self._open_stream(self._watch_config(prefix, start))
        if not replay:
            watch.lost()
        task = asyncio.create_task(self._pump(watch, prefix, stream), name=f"nats watch {prefix!r}")
        self._tasks.add(task)
        try:
            yield
        finally:
            try:
                await cancel_and_wait(task)
            finally:
                # Only now, when it has ended (cancel_and_wait waits for that even if we are
                # cancelled meanwhile): until then aclose() waits for it too.
                self._tasks.discard(task)

    async def _close(self) -> None:
        tasks, self._tasks = self._tasks, set()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self._leases.clear()
        await self._nc.close()

    # -- connection and calls -----------------------------------------------------------------

    async def _connect(self) -> None:
        try:
            async with asyncio.timeout(self.timeout):
                await self._nc.connect(
                    servers=self._target.servers,
                    name="dynamod",
                    connect_timeout=max(1, math.ceil(self.timeout)),
                    # nats-py annotates an int, but sleeps for any number of seconds.
                    reconnect_time_wait=RECONNECT_WAIT,  # type: ignore[arg-type]
                    max_reconnect_attempts=-1,
                    ping_interval=PING_INTERVAL,
                    max_outstanding_pings=2,
                    error_cb=self._on_error,
                    disconnected_cb=self._on_disconnect,
                    reconnected_cb=self._on_reconnect,
                )
                self._connected.set()
                self._marker_ttl = await self._ensure_bucket()
        except TimeoutError:
            raise StoreUnavailableError(
                f"NATS at {', '.join(self._target.hosts)} did not answer within {self.timeout} s"
            ) from None
        except nats.errors.Error as exc:
            raise self._translate(exc, "connect") from exc

    async def _on_error(self, exc: Exception) -> None:
        # nats-py reports every failed reconnect attempt here; the default prints a traceback.
        log.debug("NATS client error on %s: %s", self.url, exc)

    async def _on_disconnect(self) -> None:
        if not self._closed:
            log.warning("store %s lost its NATS connection; reconnecting", self.url)
        self._connected.clear()
        now = asyncio.get_running_loop().time()
        for deadline in self._deadlines:
            if not deadline.expired():
                deadline.reschedule(now)  # calls in flight fail now, not at their deadline
        for stream in self._streams:
            stream.signal(_LOST)

    async def _on_reconnect(self) -> None:
        log.info("store %s reconnected to NATS", self.url)
        self._connected.set()
        for stream in self._streams:
            stream.signal(_BACK)

    @contextlib.asynccontextmanager
    async def _call(self, what: str) -> AsyncIterator[None]:
        """Run one store call: open store, live connection, deadline, our errors."""
        self._check_open()
        if not self._connected.is_set():
            raise StoreUnavailableError(f"store {self.url} is not connected to NATS; {what} failed")
        try:
            async with asyncio.timeout(self.timeout) as deadline:
                self._deadlines.add(deadline)
                try:
                    yield
                finally:
                    self._deadlines.discard(deadline)
        except TimeoutError:
            raise self._unavailable(what) from None
        except nats.errors.Error as exc:
            raise self._translate(exc, what) from exc

    def _unavailable(self, what: str) -> StoreError:
        if self._closed:
            return StoreClosedError(f"store {self.url} was closed during {what}")
        if not self._connected.is_set():
            return StoreUnavailableError(f"store {self.url} lost its NATS connection during {what}")
        return StoreUnavailableError(
            f"store {self.url} did not answer {what} within {self.timeout} s"
        )

    def _translate(self, exc: nats.errors.Error, what: str) -> StoreError:
        """A nats-py error → ours. JetStream API errors other than 503 are not transient."""
        if isinstance(exc, nats.js.errors.APIError) and exc.code != 503:
            return StoreError(
                f"store {self.url}: {what} was refused by NATS: {exc.description} "
                f"(error {exc.err_code})"
            )
        if isinstance(exc, nats.errors.ConnectionClosedError) and self._closed:
            return StoreClosedError(f"store {self.url} was closed during {what}")
        return StoreUnavailableError(f"store {self.url}: {what} failed: {exc}")

    def _subject(self, key: str) -> str:
        return self._root + encode_key(validate_key(key))

    # -- bucket -------------------------------------------------------------------------------

    async def _ensure_bucket(self) -> float:
        """Create the bucket or adapt an existing one; return its marker TTL in seconds."""
        try:
            info = await self._js.stream_info(self._stream_name)
        except nats.js.errors.NotFoundError:
            info = await self._create_bucket()
        config = info.config
        if config.max_msgs_per_subject != 1:
            raise ConfigError(
                f"NATS bucket {self._target.bucket!r} keeps {config.max_msgs_per_subject} "
                "revisions per key; dynamod needs history 1, because an expiring key would "
                "otherwise reveal its older value. Use another bucket name, or recreate it"
            )
        if not config.allow_msg_ttl or not config.subject_delete_marker_ttl:
            config = dataclasses.replace(
                config,
                allow_msg_ttl=True,
                subject_delete_marker_ttl=config.subject_delete_marker_ttl or MARKER_TTL,
            )
            await self._upgrade_bucket(config)
            log.info("enabled per-key TTL and expiry markers on bucket %r", self._target.bucket)
        return config.subject_delete_marker_ttl or MARKER_TTL

    async def _upgrade_bucket(self, config: api.StreamConfig) -> None:
        try:
            await self._js.update_stream(config)
        except nats.js.errors.APIError as exc:
            raise ConfigError(
                f"NATS bucket {self._target.bucket!r} has no per-key TTL or expiry markers, "
                f"and enabling them failed: {exc.description}; recreate it with a TTL-capable "
                "nats-server (2.11 or newer)"
            ) from None

    async def _create_bucket(self) -> api.StreamInfo:
        config = api.KeyValueConfig(
            bucket=self._target.bucket, history=1, limit_marker_ttl=MARKER_TTL
        )
        try:
            await self._js.create_key_value(config)
        except nats.js.errors.KeyValueLimitMarkerTTLNotSupportedError:
            version = self._nc.connected_server_version
            raise ConfigError(
                f"NATS server {version} at {self._nc.connected_url} has no per-key TTL; "
                "dynamod needs nats-server 2.11 or newer"
            ) from None
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != _STREAM_IN_USE:  # another process created it first
                raise
        return await self._js.stream_info(self._stream_name)

    # -- reads and writes ---------------------------------------------------------------------

    async def _read(self, subject: str) -> _Message | None:
        """The last message on ``subject``, tombstones included; ``None`` if there is none."""
        try:
            raw = await self._js.get_msg(self._stream_name, subject=subject)
        except nats.js.errors.NotFoundError as exc:
            if exc.err_code != _NO_MESSAGE:
                raise
            return None
        assert raw.seq is not None
        return _Message(raw.seq, raw.data or b"", raw.headers or {})

    async def _publish(
        self, subject: str, value: bytes, headers: Mapping[str, str], *, last: int | None
    ) -> int | None:
        """Append a message; with ``last``, only while the subject is at that sequence.

        Returns the new sequence, or ``None`` when the subject had moved on.
        """
        sent = dict(headers)
        if last is not None:
            sent[EXPECT] = str(last)
        try:
            ack = await self._js.publish(subject, value, headers=sent or None)
        except nats.js.errors.APIError as exc:
            if exc.err_code in _WRONG_LAST:
                return None
            raise
        return ack.seq

    async def _put_checked(
        self, key: str, subject: str, value: bytes, expect: int | None, lease: LeaseArg
    ) -> tuple[int, dict[str, str]]:
        """A put that compares: ``expect`` set or ``lease=KEEP``. Returns (seq, headers)."""
        # A create tries the common case (the key never existed) without reading first.
        current = None if expect == 0 else await self._read(subject)
        for _ in range(ATTEMPTS):
            _check_expect(key, expect, current)
            headers = _kept_headers(current) if lease == KEEP else self._lease_headers(lease)
            last = 0 if current is None else current.seq
            seq = await self._publish(subject, value, headers, last=last)
            if seq is not None:
                return seq, headers
            current = await self._read(subject)
        raise self._conflict("put", key)

    def _conflict(self, what: str, key: str) -> ConflictError:
        return ConflictError(
            f"{what} of {key!r} lost {ATTEMPTS} compare-and-swap rounds to other writers; retry"
        )

    # -- list ---------------------------------------------------------------------------------

    async def _snapshot(self, prefix: str) -> tuple[dict[str, Entry], int]:
        """Every live key under ``prefix`` from a last-per-subject consumer, and the last
        sequence it delivered. The consumer also delivers changes made while it runs, so
        the result is the state as of the stream's end when nothing was pending any more."""
        config = self._consumer_config(prefix, api.DeliverPolicy.LAST_PER_SUBJECT)
        stream = await self._open_stream(config, bounded=False)
        entries: dict[str, Entry] = {}
        last = 0
        try:
            while stream.pending:
                msg = await self._next_data(stream)
                last = self._fold(entries, msg)
                stream.pending = msg.metadata.num_pending
        finally:
            await self._forget(stream)
        return entries, last

    async def _next_data(self, stream: _Stream) -> Msg:
        """The next data message of a list consumer; trouble is ``StoreUnavailableError``."""
        while True:
            item = await stream.inbox.get()
            problem = item if isinstance(item, str) else _sequence_problem(stream, item)
            if problem:
                raise StoreUnavailableError(f"store {self.url} could not list: {problem}")
            if isinstance(item, Msg) and not _status(item):
                return item

    def _fold(self, entries: dict[str, Entry], msg: Msg) -> int:
        event = self._event(msg)
        if isinstance(event, Put):
            entries[event.key] = event.entry
        else:
            entries.pop(event.key, None)
        return event.revision

    def _event(self, msg: Msg) -> Put | Delete:
        key = decode_key(msg.subject[len(self._root) :])
        seq = msg.metadata.sequence.stream
        if is_tombstone(msg.headers or {}):
            return Delete(key, seq)
        return Put(Entry(key, msg.data or b"", seq))

    # -- consumers ----------------------------------------------------------------------------

    def _consumer_config(
        self, prefix: str, policy: api.DeliverPolicy, start: int | None = None
    ) -> api.ConsumerConfig:
        return api.ConsumerConfig(
            deliver_policy=policy,
            opt_start_seq=start,
            filter_subjects=subject_filters(self._root, prefix),
            ack_policy=api.AckPolicy.NONE,
            max_deliver=1,
            mem_storage=True,
            num_replicas=1,
            inactive_threshold=INACTIVE,
        )

    def _watch_config(self, prefix: str, start: int | None) -> api.ConsumerConfig:
        if start is None:
            config = self._consumer_config(prefix, api.DeliverPolicy.NEW)
        else:
            config = self._consumer_config(prefix, api.DeliverPolicy.BY_START_SEQUENCE, start)
        config.idle_heartbeat = HEARTBEAT
        return config

    async def _open_stream(self, config: api.ConsumerConfig, *, bounded: bool = True) -> _Stream:
        """Subscribe to a fresh inbox, then create the consumer that delivers to it.

        A bounded inbox (watches) drops what does not fit, and the consumer-sequence check
        turns the drop into a re-established stream; a list reads everything it asked for.
        """
        inbox: asyncio.Queue[Msg | str] = asyncio.Queue(WATCH_QUEUE if bounded else 0)

        async def deliver(msg: Msg) -> None:
            with contextlib.suppress(asyncio.QueueFull):
                inbox.put_nowait(msg)

        sub = await self._nc.subscribe(self._nc.new_inbox(), cb=deliver)
        stream = _Stream(sub, inbox)
        self._streams.add(stream)
        try:
            config.deliver_subject = sub.subject
            info = await self._js.add_consumer(self._stream_name, config)
        except BaseException:
            await self._forget(stream)
            raise
        stream.consumer, stream.pending = info.name, info.num_pending or 0
        return stream

    async def _forget(self, stream: _Stream) -> None:
        """Drop a stream: always the local subscription, the consumer when we can reach it
        (otherwise the server removes it after ``INACTIVE``)."""
        self._streams.discard(stream)
        reachable = self._connected.is_set() and not self._closed
        try:
            await stream.sub.unsubscribe()
            if stream.consumer and reachable:
                async with asyncio.timeout(CLEANUP_TIMEOUT):
                    await self._js.delete_consumer(self._stream_name, stream.consumer)
        except (nats.errors.Error, TimeoutError) as exc:
            log.debug("consumer %s not removed cleanly: %s", stream.consumer, exc)

    async def _pump(self, watch: Watch, prefix: str, stream: _Stream) -> None:
        """Feed ``watch`` until cancelled, re-establishing the consumer when it breaks."""
        try:
            while True:
                try:
                    reason = await self._follow(watch, stream)
                finally:
                    await self._forget(stream)
                log.info("watch on %r in %s: %s; re-establishing", prefix, self.url, reason)
                stream = await self._reestablish(prefix)
                watch.lost()
        except StoreClosedError:
            return

    async def _follow(self, watch: Watch, stream: _Stream) -> str:
        """Push the stream's changes into ``watch``; return why the stream broke."""
        while True:
            try:
                async with asyncio.timeout(HEARTBEAT * 2.5):
                    item = await stream.inbox.get()
            except TimeoutError:
                return "no heartbeat from the server"
            if isinstance(item, str):
                return item
            problem = _sequence_problem(stream, item)
            if problem:
                return problem
            if not _status(item):
                watch.push(self._event(item))

    async def _reestablish(self, prefix: str) -> _Stream:
        delay = BACKOFF_FIRST
        while True:
            await self._connected.wait()
            try:
                async with self._call("watch"):
                    return await self._open_stream(self._watch_config(prefix, None))
            except StoreClosedError:
                raise
            except StoreError as exc:  # down again, or JetStream still recovering the stream
                log.debug("watch on %r not re-established yet: %s", prefix, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX)

    async def _replay_is_complete(self, since: int) -> bool:
        """Whether the stream still holds every change after ``since``, compacted.

        Values and delete tombstones stay until overwritten; only expiry markers vanish,
        ``marker TTL`` after they were written. A time at or before the first change after
        ``since`` that is younger than half that TTL proves none has vanished yet.
        """
        state = (await self._js.stream_info(self._stream_name)).state
        if since >= state.last_seq:
            return True
        when = await self._message_time(since) if since > 0 else None
        if when is None and state.first_seq <= since + 1:
            when = await self._message_time(state.first_seq)
        if when is None:
            return False
        age = datetime.datetime.now(datetime.UTC) - when
        return age.total_seconds() < self._marker_ttl / 2

    async def _message_time(self, seq: int) -> datetime.datetime | None:
        try:
            return (await self._js.get_msg(self._stream_name, seq=seq)).time
        except nats.js.errors.NotFoundError:
            return None

    # -- lease bookkeeping --------------------------------------------------------------------

    def _live_lease(self, lease: Lease) -> _LeaseState:
        state = self._leases.get(lease.id)
        if state is None or asyncio.get_running_loop().time() >= state.deadline:
            self._leases.pop(lease.id, None)
            raise LeaseExpiredError(f"lease {lease.id:x} has expired or was revoked")
        return state

    def _lease_headers(self, lease: LeaseArg) -> dict[str, str]:
        if not isinstance(lease, Lease):
            return {}
        remaining = self._leases[lease.id].deadline - asyncio.get_running_loop().time()
        return {TTL: str(_lease_ttl(remaining)), LEASE: f"{lease.id:x}"}

    def _rebind(self, key: str, tag: str | None, held: _Held | None) -> None:
        """Record that ``key`` now belongs to the lease named by ``tag`` (or to none)."""
        for state in self._leases.values():
            if state.tag == tag and held is not None:
                state.keys[key] = held
            else:
                state.keys.pop(key, None)

    async def _refresh_key(self, state: _LeaseState, key: str) -> None:
        """Re-publish one key of the lease with its current value and the full TTL."""
        subject, held = self._subject(key), state.keys[key]
        headers = {TTL: str(_lease_ttl(state.lease.ttl)), LEASE: state.tag}
        for _ in range(ATTEMPTS):
            seq = await self._publish(subject, held.value, headers, last=held.seq)
            if seq is not None:
                state.keys[key] = _Held(seq, held.value)
                return
            current = await self._read(subject)
            if current is None or not current.live:
                await self._expire(state, key)
            if current.headers.get(LEASE) != state.tag:
                del state.keys[key]  # its writer unbound it: no longer ours to refresh
                return
            held = _Held(current.seq, current.value)
        raise self._conflict("refresh", key)

    async def _expire(self, state: _LeaseState, key: str) -> NoReturn:
        """A key of the lease is gone, so the lease is: remove the rest, like etcd would."""
        self._leases.pop(state.lease.id, None)
        del state.keys[key]
        await self._drop_keys(state)
        raise LeaseExpiredError(
            f"lease {state.lease.id:x} has expired: its key {key!r} is gone; register again"
        )

    async def _drop_keys(self, state: _LeaseState) -> None:
        """Delete each key still bound to the lease (skipping any rebound meanwhile)."""
        for key, held in list(state.keys.items()):
            subject, seq = self._subject(key), held.seq
            for _ in range(ATTEMPTS):
                if await self._publish(subject, b"", _DELETE, last=seq) is not None:
                    break
                current = await self._read(subject)
                if current is None or not current.live or current.headers.get(LEASE) != state.tag:
                    break
                seq = current.seq
            else:
                log.warning(
                    "key %r of lease %s not deleted; it expires with its TTL", key, state.tag
                )
        state.keys.clear()


def _status(msg: Msg) -> str:
    """The status of a control message (``100`` for a heartbeat), ``""`` for data."""
    return (msg.headers or {}).get("Status", "")


def _sequence_problem(stream: _Stream, msg: Msg) -> str:
    """Check the consumer sequence of a data message or a heartbeat; describe a gap."""
    status = _status(msg)
    if status and status != "100":
        return f"the server ended the consumer ({status} {msg.headers})"
    if status:
        claimed = (msg.headers or {}).get("Nats-Last-Consumer")
        if claimed is not None and int(claimed) != stream.delivered:
            return f"messages were lost (server delivered {claimed}, {stream.delivered} arrived)"
        return ""
    seq = msg.metadata.sequence.consumer
    if seq != stream.delivered + 1:
        return f"messages were lost (consumer sequence {seq} after {stream.delivered})"
    stream.delivered = seq
    return ""


def _by_key(entry: Entry) -> str:
    return entry.key
