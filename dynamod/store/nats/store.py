"""``NatsStore``: the store calls, the connection and its deadlines, and the tasks that feed
watches (see the package docstring for the design)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Final, Self

import nats.errors
import nats.js.errors
from nats.aio.client import Client, Server
from nats.js import JetStreamContext, api

from dynamod.backoff import Backoff
from dynamod.errors import StoreClosedError, StoreError, StoreUnavailableError
from dynamod.store.base import (
    DEFAULT_TIMEOUT,
    KEEP,
    Entry,
    Lease,
    LeaseArg,
    Put,
    Store,
    Watch,
    validate_key,
)
from dynamod.store.nats.bucket import CAS_ROUNDS, Bucket, conflict
from dynamod.store.nats.consumers import HEARTBEAT, Consumer, Consumers
from dynamod.store.nats.leases import Held, Leases
from dynamod.store.nats.messages import DELETE, LEASE, check_expect, kept_headers
from dynamod.store.nats.url import NatsUrl, parse_url
from dynamod.tasks import cancel_and_wait

log = logging.getLogger(__name__)

RECONNECT_FIRST: Final = 0.1
RECONNECT_CAP: Final = 2.0
"""Bounds of the back-off between attempts to reconnect to NATS (``dynamod.backoff``): a
fleet that lost its server reconnects spread over the window, not in lockstep."""
PING_INTERVAL: Final = 5
BACKOFF_FIRST: Final = 0.05
BACKOFF_CAP: Final = 2.0
REESTABLISH_ATTEMPT: Final = 1.0
"""Seconds one attempt to re-create a watch's consumer may wait."""
_AUTH_VIOLATION: Final = "Authorization Violation"  # the server's words for a refused login
_LOST: Final = "the connection to NATS was lost"
_BACK: Final = "reconnected to NATS"


class NatsStore(Store):
    """The discovery store on a NATS JetStream KV bucket (see the package docstring)."""

    def __init__(self, target: NatsUrl, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        super().__init__(target.shown, timeout=timeout)  # names files, never secrets
        self._target = target
        self._nc = Client()
        js: JetStreamContext = self._nc.jetstream(timeout=timeout)
        self._bucket = Bucket(self._nc, js, target.bucket, target.replicas)
        self._consumers = Consumers(self._nc, js, self._bucket, self._reachable)
        self._leases = Leases(self._bucket)
        self._connected = asyncio.Event()
        self._deadlines: set[asyncio.Timeout] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_error = ""
        self._connecting = False
        self._reconnects = Backoff(RECONNECT_FIRST, RECONNECT_CAP)

    @classmethod
    async def open(cls, url: str, *, timeout: float = DEFAULT_TIMEOUT) -> Self:  # noqa: ASYNC109
        """Connect and prepare the bucket; ``timeout`` bounds this and every call."""
        store = cls(parse_url(url), timeout=timeout)
        return await store._ready(store._connect())

    @classmethod
    def check_url(cls, url: str) -> None:
        parse_url(url).check()

    # -- the contract -------------------------------------------------------------------------

    async def get(self, key: str) -> Entry | None:
        subject = self._bucket.subject(key)
        async with self._call("get"):
            current = await self._bucket.read(subject)
        if current is None or not current.live:
            return None
        return Entry(key, current.value, current.seq)

    async def put(
        self, key: str, value: bytes, *, expect: int | None = None, lease: LeaseArg = None
    ) -> int:
        subject, value = self._bucket.subject(key), bytes(value)
        async with self._call("put"):
            if isinstance(lease, Lease):
                self._leases.live(lease)
            if expect is None and lease != KEEP:
                headers = self._leases.headers(lease)
                seq = await self._bucket.publish(subject, value, headers, last=None)
                assert seq is not None  # nothing to conflict with
            else:
                seq, headers = await self._put_checked(key, subject, value, expect, lease)
        self._leases.rebind(key, headers.get(LEASE), Held(seq, value))
        return seq

    async def delete(self, key: str, *, expect: int | None = None) -> None:
        subject = self._bucket.subject(key)
        async with self._call("delete"):
            current = await self._bucket.read(subject)
            for _ in range(CAS_ROUNDS):
                check_expect(key, expect, current)
                if current is None or not current.live:
                    break
                if await self._bucket.publish(subject, b"", DELETE, last=current.seq) is not None:
                    break
                current = await self._bucket.read(subject)
            else:
                raise conflict("delete", key)
        self._leases.rebind(key, None, None)

    async def list(self, prefix: str) -> tuple[list[Entry], int]:
        validate_key(prefix, prefix=True)
        async with self._call("list"):
            floor = await self._bucket.last_seq()
            entries, last = await self._snapshot(prefix)
        return sorted(entries.values(), key=_by_key), max(floor, last)

    async def grant(self, ttl: float) -> Lease:
        self._check_open()
        return self._leases.grant(ttl)

    async def refresh(self, lease: Lease) -> None:
        async with self._call("refresh"):
            await self._leases.refresh(lease)

    async def revoke(self, lease: Lease) -> None:
        async with self._call("revoke"):
            await self._leases.revoke(lease)

    @contextlib.asynccontextmanager
    async def _stream(self, watch: Watch, prefix: str, since: int | None) -> AsyncIterator[None]:
        async with self._call("watch"):
            replay = since is not None and await self._bucket.replay_is_complete(since)
            start = since + 1 if replay and since is not None else None
            consumer = await self._consumers.open(self._consumers.watch_config(prefix, start))
        if not replay:
            watch.lost()
        task = asyncio.create_task(
            self._pump(watch, prefix, consumer), name=f"nats watch {prefix!r}"
        )
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
        # A connect cancelled inside nats-py's own close of a failed attempt (a refused
        # login ends the connect that way) leaves the client marked closed with its socket
        # open, and close() above then returns at once.
        self._drop_transport()

    # -- writes and lists ---------------------------------------------------------------------

    async def _put_checked(
        self, key: str, subject: str, value: bytes, expect: int | None, lease: LeaseArg
    ) -> tuple[int, dict[str, str]]:
        """A put that compares: ``expect`` set or ``lease=KEEP``. Returns (seq, headers)."""
        # A create tries the common case (the key never existed) without reading first.
        current = None if expect == 0 else await self._bucket.read(subject)
        for _ in range(CAS_ROUNDS):
            check_expect(key, expect, current)
            headers = kept_headers(current) if lease == KEEP else self._leases.headers(lease)
            last = 0 if current is None else current.seq
            seq = await self._bucket.publish(subject, value, headers, last=last)
            if seq is not None:
                return seq, headers
            current = await self._bucket.read(subject)
        raise conflict("put", key)

    async def _snapshot(self, prefix: str) -> tuple[dict[str, Entry], int]:
        """Every live key under ``prefix`` from a last-per-subject consumer, and the last
        sequence it delivered. The consumer also delivers changes made while it runs, so
        the result is the state as of the stream's end when nothing was pending any more."""
        config = self._consumers.config(prefix, api.DeliverPolicy.LAST_PER_SUBJECT)
        consumer = await self._consumers.open(config, bounded=False)
        entries: dict[str, Entry] = {}
        last = 0
        try:
            while consumer.pending:
                msg = await consumer.next_data()
                if isinstance(msg, str):
                    raise StoreUnavailableError(f"store {self.url} could not list: {msg}")
                event = self._bucket.event(msg)
                if isinstance(event, Put):
                    entries[event.key] = event.entry
                else:
                    entries.pop(event.key, None)
                last = event.revision
                consumer.pending = msg.metadata.num_pending
        finally:
            await self._consumers.forget(consumer)
        return entries, last

    # -- watches ------------------------------------------------------------------------------

    async def _pump(self, watch: Watch, prefix: str, consumer: Consumer) -> None:
        """Feed ``watch`` until cancelled, re-establishing the consumer when it breaks."""
        try:
            while True:
                try:
                    reason = await self._follow(watch, consumer)
                finally:
                    with _cancellable():
                        await self._consumers.forget(consumer)
                log.info("watch on %r in %s: %s; re-establishing", prefix, self.url, reason)
                consumer = await self._reestablish(prefix)
                watch.lost()
        except StoreClosedError:
            return

    async def _follow(self, watch: Watch, consumer: Consumer) -> str:
        """Push the consumer's changes into ``watch``; return why the consumer broke."""
        while True:
            msg = await consumer.next_data(within=HEARTBEAT * 2.5)
            if isinstance(msg, str):
                return msg
            watch.push(self._bucket.event(msg))

    async def _reestablish(self, prefix: str) -> Consumer:
        backoff = Backoff(BACKOFF_FIRST, BACKOFF_CAP)
        while True:
            await self._connected.wait()
            try:
                # A short deadline: while JetStream elects a stream leader a request waits
                # for it, and a new try soon after the election beats one that waits on.
                async with self._call("watch", within=REESTABLISH_ATTEMPT):
                    config = self._consumers.watch_config(prefix, None)
                    return await self._consumers.open(config)
            except StoreClosedError:
                raise
            except StoreError as exc:  # down again, or JetStream still recovering the stream
                log.debug("watch on %r not re-established yet: %s", prefix, exc)
            await backoff.wait()

    # -- connection and calls -----------------------------------------------------------------

    async def _connect(self) -> None:
        options = self._target.connect_options()  # reads the secret files: ConfigError
        hosts = ", ".join(self._target.hosts)
        try:
            async with asyncio.timeout(self.timeout):
                # nats-py retries a refused login until our deadline: a refusal ends it
                # (``_on_error`` raises ``_Refused`` out of nats-py's connect).
                self._connecting = True
                try:
                    await self._nc.connect(**self._connect_args(), **options)
                finally:
                    self._connecting = False
                self._connected.set()
                await self._bucket.ensure()
        except _Refused as refused:
            raise StoreError(
                f"NATS at {hosts} refused the login of {self.url}: {refused}; "
                "check the URL's credentials"
            ) from None
        except TimeoutError:
            raise StoreUnavailableError(
                f"NATS at {hosts} did not answer within {self.timeout} s{self._last_error}"
            ) from None
        except nats.errors.Error as exc:
            raise self._translate(exc, "connect") from exc

    def _connect_args(self) -> dict[str, Any]:
        return {
            "servers": self._target.servers,
            "name": "dynamod",
            # In URL order, as etcd members are: the first is preferred, and an operator can
            # spread processes over a cluster by ordering their URLs.
            "dont_randomize": True,
            "connect_timeout": max(1, math.ceil(self.timeout)),
            "reconnect_to_server_handler": self._next_server,
            "max_reconnect_attempts": -1,
            "ping_interval": PING_INTERVAL,
            "max_outstanding_pings": 2,
            "error_cb": self._on_error,
            "disconnected_cb": self._on_disconnect,
            "reconnected_cb": self._on_reconnect,
        }

    async def _on_error(self, exc: Exception) -> None:
        # nats-py reports every failed (re)connect attempt here; the default prints a
        # traceback. The last one explains a connect that timed out (a TLS failure).
        self._last_error = f"; last error: {type(exc).__name__}: {exc}"
        log.debug("NATS client error on %s: %s", self.url, exc)
        refused = isinstance(exc, nats.errors.AuthorizationError) or _AUTH_VIOLATION in str(exc)
        if refused and self._connecting:
            # Raised in nats-py's connect, which ends there, the socket of the refused
            # attempt still its own to close (cancelling the connect instead could land
            # inside its close of that attempt, and leak the socket).
            raise _Refused(str(exc))

    async def _on_disconnect(self) -> None:
        if not self._closed:
            log.warning("store %s lost its NATS connection; reconnecting", self.url)
        self._connected.clear()
        now = asyncio.get_running_loop().time()
        for deadline in self._deadlines:
            if not deadline.expired():
                deadline.reschedule(now)  # calls in flight fail now, not at their deadline
        self._consumers.signal(_LOST)

    def _next_server(self, servers: Sequence[Server], info: object) -> tuple[Server, float]:
        """nats-py asks where to reconnect and how long to wait first: the server tried
        least (URL order breaks ties), after the next delay of the one back-off."""
        # nats-py reuses one transport for every attempt and opens the next socket on it
        # without closing the one a failed handshake left (a server that accepts and then
        # closes): close it here, or each such attempt leaks a socket.
        self._drop_transport()
        return min(servers, key=lambda server: server.reconnects), self._reconnects.delay()

    def _drop_transport(self) -> None:
        """Close the socket nats-py holds now, if any (see the callers)."""
        transport = self._nc._transport
        if transport is not None:
            transport.close()  # type: ignore[no-untyped-call]  # nats-py is untyped here

    async def _on_reconnect(self) -> None:
        log.info("store %s reconnected to NATS", self.url)
        self._reconnects.reset()
        self._connected.set()
        self._consumers.signal(_BACK)

    def _reachable(self) -> bool:
        """Whether the server can be asked for something now (removing a consumer)."""
        return self._connected.is_set() and not self._closed

    @contextlib.asynccontextmanager
    async def _call(self, what: str, *, within: float | None = None) -> AsyncIterator[None]:
        """Run one store call: open store, live connection, deadline, our errors."""
        self._check_open()
        if not self._connected.is_set():
            raise StoreUnavailableError(f"store {self.url} is not connected to NATS; {what} failed")
        try:
            async with asyncio.timeout(within or self.timeout) as deadline:
                self._deadlines.add(deadline)
                try:
                    with _cancellable():
                        yield
                finally:
                    self._deadlines.discard(deadline)
        except TimeoutError:
            raise self._unavailable(what, within or self.timeout) from None
        except nats.errors.Error as exc:
            raise self._translate(exc, what) from exc

    def _unavailable(self, what: str, seconds: float) -> StoreError:
        if self._closed:
            return StoreClosedError(f"store {self.url} was closed during {what}")
        if not self._connected.is_set():
            return StoreUnavailableError(f"store {self.url} lost its NATS connection during {what}")
        return StoreUnavailableError(f"store {self.url} did not answer {what} within {seconds} s")

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


def _by_key(entry: Entry) -> str:
    return entry.key


class _Refused(Exception):
    """The server refused the login (``_on_error`` during a connect)."""


@contextlib.contextmanager
def _cancellable() -> Iterator[None]:
    """Raise the cancellation nats-py swallowed inside the block.

    nats-py catches a ``CancelledError`` that lands in its flush (``_flush_pending``): the
    call returns as if nothing happened, or fails later with an error of its own, and the
    cancelled task carries on (a watch pump that never ends, a campaign that retries the
    error, an exit that waits forever). The task's ``cancelling()`` count still shows the
    cancellation: when it grew during the block, it is raised again here in place of
    whatever the block ended with, so every caller of this store can rely on cancellation
    as on any other (a deadline's own cancellation included: ``asyncio.timeout`` turns it
    into its ``TimeoutError``)."""
    task = asyncio.current_task()
    before = task.cancelling() if task is not None else 0
    try:
        yield
    except Exception as exc:
        if task is not None and task.cancelling() > before:
            raise asyncio.CancelledError from exc
        raise
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError
