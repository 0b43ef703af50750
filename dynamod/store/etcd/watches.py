"""The etcd watch streams behind each ``watch()`` (see "Watches" in the package docstring).

A ``WatchStream`` establishes a stream on the member in use, pushes its events into the ``Watch``,
and when the stream ends (member lost, etcd restart, compaction) opens another, on whichever
member now serves, from the revision after the last one it delivered. Only when that
history is not there any more (compacted, or a cluster that is not the same one) does the
watch get a ``Resync`` instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Final

import grpc
from aetcd import rpc

from dynamod.backoff import Backoff
from dynamod.errors import StoreClosedError, StoreError, StoreUnavailableError
from dynamod.store.base import Delete, Entry, Put, Watch
from dynamod.store.etcd.members import Member, MemberFailed, Members, NoMember

log = logging.getLogger(__name__)

Message = Any
BACKOFF_FIRST: Final = 0.05
BACKOFF_CAP: Final = 2.0
# etcd ends the watches of a member that lost its leader when the stream asks it to, so a
# partitioned member cannot leave a watch silently stale.
REQUIRE_LEADER: Final = (("hasleader", "true"),)


@dataclass
class Position:
    """How far a watch has been fed: every change up to ``revision`` of cluster ``cluster``
    was pushed (or is covered by the ``Resync`` the watch was told to make)."""

    revision: int
    cluster: int


@dataclass(frozen=True)
class Stream:
    """One established etcd watch stream."""

    call: Any
    responses: AsyncIterator[Message]
    member: Member
    revision: int  # the member's revision when it confirmed the stream
    cluster: int

    def covers(self, position: Position) -> bool:
        """Whether this stream, opened from ``position.revision + 1``, plainly continues that
        history: same cluster, and already at or past that revision."""
        return self.cluster == position.cluster and self.revision >= position.revision


class WatchStream:
    """Feeds one ``Watch`` from etcd; ``start`` establishes it, ``run`` pumps until cancelled."""

    def __init__(
        self,
        members: Members,
        watch: Watch,
        span: tuple[bytes, bytes],
        entry: Callable[[Message], Entry | None],
    ) -> None:
        self._members = members
        self._watch = watch
        self._span = span
        self._entry = entry

    async def start(self, since: int | None) -> tuple[Stream, Position]:
        """The first stream: from now (the watch starts with a ``Resync``), or replaying the
        changes after ``since`` (a ``Resync`` when that history is not there)."""
        if since is not None:
            position = Position(max(since, 0), 0)
            stream = await self._subscribe(position.revision + 1)
            position.cluster = stream.cluster
            if await self._continues(stream, position):
                return stream, position
            stream.call.cancel()  # revisions went back: ``since`` is from another history
        stream = await self._subscribe(None)
        self._watch.lost()
        return stream, Position(stream.revision, stream.cluster)

    async def run(self, stream: Stream, position: Position) -> None:
        """Feed the watch from ``stream``, and from a new stream each time one ends."""
        backoff = Backoff(BACKOFF_FIRST, BACKOFF_CAP)
        try:
            while True:
                received, resumable = await self._forward(stream, position)
                if received:
                    backoff.reset()  # that stream worked; a stream etcd ends at once did not
                stream, resumed = await self._resubscribe(position if resumable else None, backoff)
                if not resumed:
                    position.revision, position.cluster = stream.revision, stream.cluster
                    self._watch.lost()
        except StoreClosedError:
            return
        finally:
            self._watch.close()  # however the feed ends, the consumer stops waiting for it

    # -- one stream ----------------------------------------------------------------------

    async def _subscribe(self, start: int | None) -> Stream:
        """Open a stream from revision ``start`` (None: from now) on the member in use and
        return once etcd confirmed it: every later change will come through it."""
        members = self._members
        deadline = asyncio.get_running_loop().time() + members.timeout
        try:
            member = await members.current(deadline, "open a watch")
        except NoMember as exc:
            raise StoreUnavailableError(f"etcd at {members.url} could not watch: {exc}") from None
        create = rpc.WatchCreateRequest(
            key=self._span[0],
            range_end=self._span[1],
            start_revision=start or 0,
            progress_notify=True,
        )
        call = member.watch.Watch(metadata=member.metadata + REQUIRE_LEADER)
        responses = _responses(call)
        try:
            created = await self._created(call, responses, create, member, deadline)
        except BaseException:
            call.cancel()
            raise
        header = created.header
        return Stream(call, responses, member, int(header.revision), int(header.cluster_id))

    async def _created(
        self,
        call: Any,
        responses: AsyncIterator[Message],
        create: Message,
        member: Member,
        deadline: float,
    ) -> Message:
        url = self._members.url
        try:
            async with self._members.translated("open a watch", member):
                async with asyncio.timeout_at(deadline):
                    await call.write(rpc.WatchRequest(create_request=create))
                    created = await anext(responses, None)
        except MemberFailed as exc:
            raise StoreUnavailableError(f"etcd at {url} could not open a watch: {exc}") from None
        except TimeoutError:
            await self._members.failed(member, "no answer to a new watch")
            raise StoreUnavailableError(
                f"etcd at {url} did not open a watch within {self._members.timeout} s"
            ) from None
        if created is None or not created.created or created.canceled:
            reason = "" if created is None else created.cancel_reason
            raise StoreUnavailableError(f"etcd at {url} ended a new watch: {reason}")
        return created

    async def _forward(self, stream: Stream, position: Position) -> tuple[bool, bool]:
        """Push the stream's events until it ends; return (whether anything came through,
        whether the history after ``position`` is still there to resume from)."""
        received = False
        try:
            async with self._members.translated("watch", stream.member):
                async for response in stream.responses:
                    if response.canceled:
                        return received, self._canceled(response)
                    received = True
                    self._push(response, position)
                    del response  # not kept while the next one is awaited (see _responses)
        except MemberFailed as exc:
            log.warning("a watch stream on %s broke: %s", self._members.url, exc)
        except StoreClosedError:
            raise
        except StoreError as exc:
            log.warning("a watch stream broke: %s", exc)
        finally:
            stream.call.cancel()
        return received, True

    async def _continues(self, stream: Stream, position: Position) -> bool:
        """Whether ``stream`` continues the history up to ``position``. A member may lag a
        little behind the one the position came from; then a linearizable read tells a lag
        (it waits until the member caught up) from revisions that went back, as in a
        cluster restored from a backup. A stream from a lagging member still delivers every
        change after the position, as the member applies it."""
        if stream.covers(position):
            return True
        if stream.cluster != position.cluster:
            return False
        try:
            return await self._members.revision() >= position.revision
        except StoreClosedError:
            raise
        except StoreError:
            return False  # cannot tell: a Resync is always right

    def _canceled(self, response: Message) -> bool:
        log.warning(
            "etcd ended a watch on %s (compact revision %d, reason %r)",
            self._members.url,
            response.compact_revision,
            response.cancel_reason,
        )
        return not response.compact_revision

    def _push(self, response: Message, position: Position) -> None:
        if not response.events:
            # A progress notification: every change up to its revision was delivered.
            position.revision = max(position.revision, int(response.header.revision))
            return
        for event in response.events:
            position.revision = int(event.kv.mod_revision)
            entry = self._entry(event.kv)
            if entry is None:
                continue
            if event.type == rpc.Event.DELETE:
                self._watch.push(Delete(entry.key, entry.revision))
            else:
                self._watch.push(Put(entry))

    async def _resubscribe(
        self, position: Position | None, backoff: Backoff
    ) -> tuple[Stream, bool]:
        """A new stream and whether it resumes after ``position`` (else it starts now, and
        the watch needs a ``Resync``); waiting longer after each failure."""
        failures = 0
        while True:
            await backoff.wait()
            try:
                stream = await self._subscribe(None if position is None else position.revision + 1)
            except StoreClosedError:
                raise
            except StoreError as exc:
                level = logging.DEBUG if failures else logging.WARNING
                log.log(level, "cannot watch again yet, retrying: %s", exc)
                failures += 1
                continue
            if position is not None and not await self._continues(stream, position):
                stream.call.cancel()
                log.info(
                    "etcd at %s has another history now; the watch resyncs", stream.member.name
                )
                position = None
                continue
            if failures:
                log.info(
                    "watch on %s re-established after %d failed attempts",
                    self._members.url,
                    failures,
                )
            return stream, position is not None


async def _responses(call: Any) -> AsyncIterator[Message]:
    """The stream's responses, as ``aiter(call)`` gives them, except that none is held
    while the next one is awaited: gRPC's own iterator keeps the last until the next
    arrives, and on a quiet watch that may be ten minutes of one large value."""
    while True:
        response = await call.read()
        if response is grpc.aio.EOF:
            return
        yield response
        del response
