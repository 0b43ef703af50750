"""The connection to one etcd member at a time, and the move to another (see "Members and
failover" in the package docstring).

``Members.call`` runs one request: on the member in use, under the call's deadline, moving
to the next member when this one broke and retrying there when that is safe. A watch feed
uses the parts (``current``, ``failed``) to do the same with its stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import grpc
from aetcd import rpc

from dynamod.errors import StoreClosedError, StoreError, StoreUnavailableError
from dynamod.store.etcd.faults import Fault, classify, describe, refused, unsent
from dynamod.store.etcd.url import EtcdUrl

log = logging.getLogger(__name__)

T = TypeVar("T")
Message = Any  # aetcd ships no type hints: its messages and stubs are ``Any`` here

CHANNEL_OPTIONS: Final = (
    # A watch stream can be quiet for hours: pings find a dead peer. etcd refuses pings
    # more often than every 5 s (--grpc-keepalive-min-time).
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    # A list of many worker records can exceed gRPC's 4 MiB default.
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    # Each store connects on its own: gRPC's process-wide subchannel pool would share one
    # connection (and its reconnect timer) between every store of a process to a member.
    ("grpc.use_local_subchannel_pool", 1),
)


@dataclass(eq=False)
class Member:
    """One member's channel, its stubs and the metadata every call carries (the token)."""

    index: int
    name: str
    channel: grpc.aio.Channel
    metadata: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        self.kv = rpc.KVStub(self.channel)
        self.lease = rpc.LeaseStub(self.channel)
        self.watch = rpc.WatchStub(self.channel)
        self.auth = rpc.AuthStub(self.channel)


class NoMember(Exception):
    """No member could be reached; the text says why, member by member."""


class Members:
    """The member in use and the failover; see the module docstring."""

    def __init__(self, target: EtcdUrl, timeout: float, probe: Message) -> None:
        self.url = target.url
        self.timeout = timeout
        self._endpoints = target.endpoints
        self._user = target.login.user if target.login else None
        self._password = target.login.password() if target.login else None
        self._credentials = _credentials(target)
        self._probe = probe
        self._current: Member | None = None
        self._next = 0  # the endpoint a connect sweep tries first
        self._lock = asyncio.Lock()
        self._sweeps = 0
        self._sweep_failure = ""
        self._closed = False

    @property
    def attempt(self) -> float:
        """How long one try on one member may take. With several members it is half the
        call's deadline, leaving the rest to a member that answers: a member that stopped
        answering costs a call that much."""
        return self.timeout / 2 if len(self._endpoints) > 1 else self.timeout

    async def open(self) -> None:
        try:
            await self.current(self._deadline(), "connect")
        except NoMember as exc:
            raise StoreUnavailableError(
                f"no etcd member of {self.url!r} answered within {self.timeout} s: {exc}"
            ) from None

    async def close(self) -> None:
        self._closed = True
        member, self._current = self._current, None
        if member is not None:
            await member.channel.close()

    async def call(
        self,
        what: str,
        invoke: Callable[[Member, float], Awaitable[T]],
        *,
        retry: bool,
        attempt: float | None = None,
    ) -> T:
        """``invoke(member, seconds)`` on the member in use, under the store's deadline.

        When the member broke, move to the next one; send the request there too if
        ``retry`` (it may run twice) or if it never left. ``attempt`` caps one try.
        """
        deadline = self._deadline()
        last = "no attempt was made"
        while True:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise StoreUnavailableError(
                    f"etcd at {self.url} did not {what} within {self.timeout} s: {last}"
                )
            try:
                member = await self.current(deadline, what)
            except NoMember as exc:
                raise StoreUnavailableError(f"etcd at {self.url} could not {what}: {exc}") from None
            try:
                async with self.translated(what, member):
                    return await invoke(member, min(left, attempt or self.attempt))
            except MemberFailed as failed:
                last = failed.reason
                if not (retry or failed.unsent):
                    raise StoreUnavailableError(
                        f"etcd at {self.url} could not {what}: {last}; the member failed with "
                        "the request in flight, so it may or may not have been applied"
                    ) from None

    async def revision(self) -> int:
        """The cluster's revision now: a linearizable read, which a member answers only once
        it has applied everything committed before it."""

        async def read(member: Member, seconds: float) -> Message:
            return await member.kv.Range(self._probe, timeout=seconds, metadata=member.metadata)

        return int((await self.call("read the revision", read, retry=True)).header.revision)

    @contextlib.asynccontextmanager
    async def translated(self, what: str, member: Member) -> AsyncIterator[None]:
        """Run one request on ``member``: a broken member raises ``MemberFailed`` (after moving on
        from it, or after a new token), anything else our error."""
        self._check_open(what)
        try:
            yield
        except rpc.AioRpcError as exc:
            if self._closed:
                raise StoreClosedError(f"store {self.url} was closed during {what}") from None
            fault = classify(exc)
            if fault is Fault.TOKEN:
                # etcd forgot the token (it lives ~5 idle minutes, in memory): connecting
                # again logs in again; the request was refused, so it may be sent again.
                await self.failed(member, describe(exc))
                raise MemberFailed(describe(exc), unsent=True) from None
            if fault is Fault.BROKEN:
                await self.failed(member, describe(exc))
                raise MemberFailed(f"{member.name}: {describe(exc)}", unsent(exc)) from None
            if fault is Fault.BUSY:
                raise StoreUnavailableError(
                    f"etcd at {self.url} could not {what}: {describe(exc)}"
                ) from None
            raise refused(self.url, what, exc) from None
        except asyncio.CancelledError:
            if _cancelled_by_owner():
                raise
            # The channel was closed under the call: aclose(), or a failover by another call.
            if self._closed:
                raise StoreClosedError(f"store {self.url} was closed during {what}") from None
            raise MemberFailed(f"{member.name} was left for another member", False) from None

    async def current(self, deadline: float, what: str) -> Member:
        """The member in use, connecting to one first if there is none (``NoMember``)."""
        self._check_open(what)
        if self._current is not None:
            return self._current
        sweeps = self._sweeps
        try:
            async with asyncio.timeout_at(deadline):
                await self._lock.acquire()
        except TimeoutError:
            raise NoMember("the deadline passed while another call was connecting") from None
        try:
            # Read again: another call may have connected while this one waited.
            member: Member | None = self._current
            if member is None and self._sweeps != sweeps:
                raise NoMember(self._sweep_failure)  # a sweep ended meanwhile: its verdict
            return member or await self._sweep(deadline)
        finally:
            self._lock.release()

    async def failed(self, member: Member, reason: str) -> None:
        """``member`` broke: stop using it, and close its channel, which ends every call and
        stream still on it (they move to the next member)."""
        if self._current is not member:
            return  # another call saw it first
        log.warning("etcd member %s of %s failed: %s; moving on", member.name, self.url, reason)
        self._current = None
        self._next = (member.index + 1) % len(self._endpoints)
        await member.channel.close()

    # -- connecting -------------------------------------------------------------------------

    async def _sweep(self, deadline: float) -> Member:
        """Connect to the first member, from ``_next`` round the list, that answers."""
        failures: list[str] = []
        count = len(self._endpoints)
        for step in range(count):
            index = (self._next + step) % count
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            try:
                member = await self._connect(index, min(left, self.attempt))
            except NoMember as exc:
                failures.append(str(exc))
                continue
            if self._closed:  # aclose() ran while this connected: nothing may outlive it
                await member.channel.close()
                raise StoreClosedError(f"store {self.url} was closed while connecting")
            if failures:
                log.info("etcd store %s now uses member %s", self.url, member.name)
            self._current = member
            return member
        self._sweeps += 1
        self._sweep_failure = "; ".join(failures) or "the deadline passed before a try"
        raise NoMember(self._sweep_failure)

    async def _connect(self, index: int, limit: float) -> Member:
        host, port = self._endpoints[index]
        name = f"{host}:{port}"
        if self._credentials is None:
            channel = grpc.aio.insecure_channel(name, options=CHANNEL_OPTIONS)
        else:
            channel = grpc.aio.secure_channel(name, self._credentials, options=CHANNEL_OPTIONS)
        member = Member(index, name, channel)
        try:
            async with asyncio.timeout(limit):
                await self._authenticate(member)
                # A linearizable read: it answers only when the member's cluster has a leader.
                await member.kv.Range(self._probe, metadata=member.metadata)
        except TimeoutError:
            await channel.close()
            raise NoMember(f"{name}: no answer within {limit:.3g} s") from None
        except rpc.AioRpcError as exc:
            await channel.close()
            if classify(exc) is Fault.REFUSED:
                who = f"as user {self._user!r}" if self._user else "without a user"
                raise refused(self.url, f"connect {who}", exc) from None
            raise NoMember(f"{name}: {describe(exc)}") from None
        except BaseException:
            await channel.close()
            raise
        return member

    async def _authenticate(self, member: Member) -> None:
        if self._user is None:
            return
        request = rpc.AuthenticateRequest(name=self._user, password=self._password)
        try:
            reply = await member.auth.Authenticate(request)
        except rpc.AioRpcError as exc:
            if exc.code() == rpc.StatusCode.FAILED_PRECONDITION:
                raise StoreError(
                    f"etcd at {self.url} has authentication off, but the URL names user "
                    f"{self._user!r}: drop user and password_file, or enable auth in etcd"
                ) from None
            raise
        member.metadata = (("token", reply.token),)

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self.timeout

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.url} is closed; cannot {what}")


class MemberFailed(Exception):
    """One attempt on a member failed in a way another attempt might not."""

    def __init__(self, reason: str, unsent: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.unsent = unsent


def _cancelled_by_owner() -> bool:
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


def _credentials(target: EtcdUrl) -> grpc.ChannelCredentials | None:
    if target.tls is None:
        return None
    ca, key, cert = target.tls.pem()
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )
