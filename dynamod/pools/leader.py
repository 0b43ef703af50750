"""Leader election on any ``Store``: one writer at a time across every dynamod on a store.

Only the store contract is used (``store/base.py``), so every backend elects the same way:

Campaign
    A contender watches the leader key, grants a lease of ``ttl`` seconds and creates the
    key on it with ``expect=0``. The one create that succeeds wins; its revision is the
    term's **epoch**, strictly increasing across leaders because store revisions are. The
    winner writes the epoch into the key's value (``read_leader`` shows it). The losers
    revoke their lease and wait on their watch until the key is gone (deleted, its lease
    revoked or expired), then campaign again.
Holding
    The leader refreshes its lease every ``ttl / 4`` (sooner after a failed refresh) and
    is leader only until ``ttl / 2`` after it *sent* the last refresh that succeeded (or
    the grant). Then, or when the lease is reported gone, or when the key is deleted or
    rewritten by someone else, it is deposed: ``Leadership.lost`` is set and ``fence()``
    raises ``NotLeaderError`` from that instant, whatever the event loop is doing.
    ``fence()`` reads the clock itself, so a leader that was paused (a GC pause,
    SIGSTOP) refuses to write when it wakes even before its timers have run.
Why a deposed leader stops before another can start
    The store restarts a lease's TTL when it processes a refresh, which is after the
    leader sent it; so the lease, and with it the key, lives at least until ``sent +
    ttl``, and no other contender can create the key before then (etcd and NATS round TTLs
    up to whole seconds: longer, never shorter). The leader stops acting at ``sent +
    ttl / 2``. The other half of the TTL is the margin for what the clocks cannot see: a
    write that passed ``fence()`` just before the deadline and is still in flight (store
    calls have a deadline of ``store.timeout``, 5 s by default, so keep ``ttl >= 2 *
    store.timeout``, or bound each write by ``Leadership.remaining()``; the default
    ``ttl`` is 15 s, as Kubernetes' leases), and clock rate
    differences between this machine and the store's (parts per million). The clock is
    ``CLOCK_BOOTTIME`` where Linux has it, which keeps counting while the machine is
    suspended, so a leader that wakes from a suspend does not believe its old deadline.
Fenced on the store where the store can
    Where the store has multi-key transactions (``Store.max_swaps > 0``: etcd, and the
    memory store as the reference) and holds the records too (no ``state_store`` of its
    own), the leader's moves are written with ``swap_all``
    guarded by the leader key at the revision this term wrote it (``Leadership.guard``), in
    the same transaction: once the key was deleted, expired, or created or rewritten by
    another, the write cannot apply, however late it arrives (a request sent before a
    SIGSTOP of etcd and applied after the thaw), and fails with ``NotLeaderError`` ("the
    term that made this write has ended"); the writer deposes the term with it
    (``Leadership.depose``), which ends it here too: the lease is revoked and the
    campaign starts again. Where it cannot (NATS, file, a Dynamo fleet's
    routes), the epoch fences by time only: the reconciler calls ``fence()`` right before
    each write and writes the epoch in its audit line, and a write in flight at the
    deadline may still land within the margin above. The history of a policy is one key
    written with a compare-and-swap at the revision read, fenced by time on every store.
    Deleting the leader key by hand is outside the time fence's guarantee: the new leader
    may start before the old one has seen the delete.
Failover
    When a leader's lease expires, watchers see the key's delete within about a second
    (the store contract), and the first contender to create it leads: within ``ttl + 1``
    seconds of the last refresh. A clean exit (leaving ``async with``) sets ``lost``
    first, then revokes the lease, so the next leader starts at once.
Structure
    ``async with LeaderElection(...)`` owns one task, which owns its children (the refresh
    loop and the watch of a term, through ``aio.race``); leaving the block cancels and
    awaits it. A ``CancelledError`` is never swallowed (the NATS store raises again one its
    client swallowed). Only ``StoreUnavailableError`` is ridden out (with the one back-off,
    ``dynamod.backoff``, capped at a quarter of the TTL); any other failure of the
    campaign (a closed store, a bug) ends it, and is raised by ``wait_leading`` and by the
    exit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Final, Self

from dynamod import jsoncodec
from dynamod.backoff import Backoff
from dynamod.errors import (
    InvalidInputError,
    KeyNotFoundError,
    LeaseExpiredError,
    NotLeaderError,
    RevisionMismatchError,
    StoreError,
    StoreUnavailableError,
)
from dynamod.store import Delete, Entry, Guard, Lease, Put, Resync, Store, Watch
from dynamod.store.base import validate_key
from dynamod.tasks import cancel_and_wait, race

log = logging.getLogger(__name__)

LEADER_KEY: Final = "v1/leaders/pools"
"""The pool reconciler's leader key, beside ``v1/workers`` and ``v1/pools``."""
DEFAULT_TTL: Final = 15.0
VALID_SHARE: Final = 0.5
"""A leader acts until ``VALID_SHARE * ttl`` after sending its last successful refresh."""
REFRESH_SHARE: Final = 0.25
"""It refreshes every ``REFRESH_SHARE * ttl``: one lost refresh leaves time for another."""
RETRY_FIRST: Final = 0.1
"""The first back-off bound when the store cannot be reached to campaign."""
_CLOCK: Final = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def now() -> float:
    """The election's clock: monotonic, and counting through a suspend where it can."""
    return time.clock_gettime(_CLOCK)


@dataclass(frozen=True)
class LeaderInfo:
    """Who leads now, as any process reads it from the store (``status``)."""

    identity: str
    epoch: int


class Leadership:
    """One term as leader. ``lost`` is set once the term is over; ``fence()`` is the check
    before each write."""

    def __init__(
        self,
        identity: str,
        epoch: int,
        lease: Lease,
        ttl: float,
        deadline: float,
        guard: Guard | None = None,
    ) -> None:
        self.identity = identity
        self.epoch = epoch
        self.guard = guard
        """The leader key at the revision this term wrote it at: the condition of a write
        fenced on the store (``Store.swap_all(guard=...)``); any change to the key (a
        delete, an expiry, another's create or rewrite) fails it."""
        self.lease = lease
        """The lease the leader key lives on (``lease.ttl`` is what the store granted)."""
        self.ttl = ttl
        """The TTL asked for, which the deadline is computed from."""
        self.lost = asyncio.Event()
        self.reason = ""
        """Why the term ended (empty while it lasts)."""
        self._deadline = deadline

    def fence(self) -> int:
        """The epoch, if this process still leads at this instant; else ``NotLeaderError``.
        Call it right before each write only the leader may make."""
        if not self.lost.is_set() and now() >= self._deadline:
            self.depose(f"its lease was not refreshed for {self.ttl * VALID_SHARE:g} s")
        if self.lost.is_set():
            raise NotLeaderError(
                f"{self.identity} no longer leads (epoch {self.epoch}): {self.reason}"
            )
        return self.epoch

    def remaining(self) -> float:
        """Seconds this term is certain to last (0 once lost): a bound for a write."""
        return 0.0 if self.lost.is_set() else max(0.0, self._deadline - now())

    def extend(self, sent: float) -> None:
        """A refresh sent at ``sent`` succeeded: the term lasts until ``ttl / 2`` after."""
        self._deadline = max(self._deadline, sent + self.ttl * VALID_SHARE)

    def depose(self, reason: str) -> None:
        if not self.lost.is_set():
            self.reason = reason
            self.lost.set()
            log.warning("%s no longer leads (epoch %d): %s", self.identity, self.epoch, reason)


async def read_leader(store: Store, key: str = LEADER_KEY) -> LeaderInfo | None:
    """Who holds ``key`` now, or None; the epoch is the create's revision."""
    entry = await store.get(key)
    return None if entry is None else leader_of(entry)


def leader_of(entry: Entry) -> LeaderInfo:
    """Who a leader key's entry names (a watcher's ``Put``); the epoch is the create's
    revision, which the first write of a term is."""
    identity, _, epoch = _decode(entry.value)
    return LeaderInfo(identity, epoch or entry.revision)


class LeaderElection:
    """Campaign for ``key`` as ``identity`` (``host:pid`` by default) while the ``async
    with`` block runs.

    ``await wait_leading()`` returns the ``Leadership`` of the term in progress, waiting
    for one; a deposed leader campaigns again (a new term, a higher epoch).
    """

    def __init__(
        self, store: Store, key: str = LEADER_KEY, identity: str = "", *, ttl: float = DEFAULT_TTL
    ) -> None:
        if not ttl > 0:
            raise ValueError(f"a leader's lease TTL must be a positive number of seconds: {ttl}")
        self.store = store
        self.key = validate_key(key)
        self.identity = identity or f"{socket.gethostname()}:{os.getpid()}"
        self.ttl = float(ttl)
        self._current: Leadership | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._run(), name=f"leader election {self.key}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    @property
    def leading(self) -> Leadership | None:
        """The term in progress (not lost, deadline not passed), or None."""
        current = self._current
        return current if current is not None and current.remaining() > 0 else None

    async def wait_leading(self) -> Leadership:
        """The term in progress, once there is one; raises what ended the campaign."""
        while True:
            changed = self._changed
            if self.leading is not None:
                return self.leading
            if self._task is None:
                raise RuntimeError("wait_leading() is for inside `async with LeaderElection`")
            if self._task.done():
                if not self._task.cancelled():
                    self._task.result()  # raises what ended the campaign
                raise RuntimeError("the leader election has ended")
            await changed.wait()

    async def leader(self) -> LeaderInfo | None:
        """Who leads now (any process may ask; a follower's ``status``)."""
        return await read_leader(self.store, self.key)

    async def _run(self) -> None:
        backoff = Backoff(RETRY_FIRST, max(self.ttl * REFRESH_SHARE, RETRY_FIRST))
        try:
            while True:
                try:
                    await self._term()
                    backoff.reset()
                except StoreUnavailableError as exc:
                    log.warning("leader election on %r: %s; campaigning again", self.key, exc)
                    await backoff.wait()
        finally:
            self._announce()  # wake wait_leading, which sees the task done

    async def _term(self) -> None:
        """Campaign until this process leads, then hold the term until it ends."""
        async with self.store.watch(self.key) as watch:
            won = await self._try_create()
            while won is None:
                await _until_vacant(watch, self.key)
                won = await self._try_create()
            leadership, token = won
            self._begin(leadership)
            try:
                await race(
                    self._keep(leadership),
                    self._guard(watch, leadership, token),
                    leadership.lost.wait(),  # deposed by a writer (the store refused its guard)
                )
            finally:
                # Lost already, unless the election is being closed (or its task failed).
                leadership.depose("its term ended: the election was closed or failed")
                self._announce()
                await self._release(leadership.lease)

    async def _try_create(self) -> tuple[Leadership, str] | None:
        """Create the key on a fresh lease: the term, or None when another holds it."""
        sent = now()
        lease = await self.store.grant(self.ttl)
        token = secrets.token_hex(8)
        try:
            first = _encode(self.identity, token)
            epoch = await self.store.put(self.key, first, expect=0, lease=lease)
            value = _encode(self.identity, token, epoch)
            written = await self.store.put(self.key, value, expect=epoch, lease=lease)
        except (RevisionMismatchError, KeyNotFoundError):
            await self._release(lease)
            return None
        except BaseException:
            await self._release(lease)  # the create's outcome may be unknown: undo it
            raise
        deadline = sent + self.ttl * VALID_SHARE
        guard = Guard(self.key, written)
        return Leadership(self.identity, epoch, lease, self.ttl, deadline, guard), token

    def _begin(self, leadership: Leadership) -> None:
        self._current = leadership
        log.info("%s leads %r from epoch %d", self.identity, self.key, leadership.epoch)
        self._announce()

    async def _keep(self, leadership: Leadership) -> None:
        """Refresh the lease; depose at the deadline, or when the lease is gone."""
        lease = leadership.lease
        interval = self.ttl * REFRESH_SHARE
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(leadership.remaining()) as deadline:
                while True:
                    await asyncio.sleep(interval)
                    sent = now()
                    try:
                        await self.store.refresh(lease)
                    except StoreUnavailableError as exc:
                        log.warning("leader lease %x not refreshed, retrying: %s", lease.id, exc)
                        interval = max(self.ttl / 10, 0.1)
                        continue
                    leadership.extend(sent)
                    deadline.reschedule(loop.time() + leadership.remaining())
                    interval = self.ttl * REFRESH_SHARE
        except TimeoutError:
            leadership.depose(f"its lease was not refreshed for {self.ttl * VALID_SHARE:g} s")
        except LeaseExpiredError:
            leadership.depose("its lease has expired or was revoked")

    async def _guard(self, watch: Watch, leadership: Leadership, token: str) -> None:
        """Depose when the key is deleted or someone else's; events older than the term
        (still queued from the campaign) say nothing about it."""
        async for event in watch:
            if event.revision < leadership.epoch:
                continue
            if isinstance(event, Resync):
                mine = any(
                    e.key == self.key and _decode(e.value)[1] == token for e in event.entries
                )
            elif isinstance(event, Put):
                mine = event.key != self.key or _decode(event.entry.value)[1] == token
            else:
                mine = event.key != self.key
            if not mine:
                leadership.depose("its leader key was deleted or taken over")
                return
        leadership.depose("the store was closed")

    async def _release(self, lease: Lease) -> None:
        """Revoke ``lease`` (its key goes with it), bounded; a failure is only logged: the
        lease then ends with its TTL."""
        try:
            async with asyncio.timeout(self.store.timeout):
                await self.store.revoke(lease)
        except (StoreError, TimeoutError) as exc:
            log.warning("leader lease %x not revoked (it expires with its TTL): %s", lease.id, exc)

    def _announce(self) -> None:
        """Wake ``wait_leading``: the term began or ended, or the campaign did."""
        self._changed.set()
        self._changed = asyncio.Event()


async def _until_vacant(watch: Watch, key: str) -> None:
    """Wait until ``key`` is absent: a delete, or a snapshot without it."""
    async for event in watch:
        if isinstance(event, Delete) and event.key == key:
            return
        if isinstance(event, Resync) and all(e.key != key for e in event.entries):
            return


def _encode(identity: str, token: str, epoch: int | None = None) -> bytes:
    body: dict[str, object] = {"identity": identity, "term": token}
    if epoch is not None:
        body["epoch"] = epoch
    return jsoncodec.canonical(body)


def _decode(value: bytes) -> tuple[str, str, int | None]:
    """(identity, term token, epoch) of a leader key's value; a value this module did not
    write reads as nobody's ("", "", None), so a leader seeing it is deposed."""
    try:
        body = jsoncodec.read(value, "the leader key")
    except InvalidInputError:
        return "", "", None
    if not isinstance(body, dict):
        return "", "", None
    identity, token, epoch = body.get("identity"), body.get("term"), body.get("epoch")
    if not (isinstance(identity, str) and isinstance(token, str)):
        return "", "", None
    return identity, token, epoch if isinstance(epoch, int) else None
