"""Waiting for workers to drain: each one's in-flight figures, sent as they change.

A drain is the cordon and the drain taint (``dynamo.io/draining``) set in one taint
update; this waits for what follows. ``DrainWatch`` listens to the two things that
change a worker's figures, and to nothing else:

* the router (``Router.watch``): its own requests on the worker begin and end, and the
  worker's engine reports its running and waiting requests (and its health);
* the view (``WorkerView.listen``): the worker's taints change (an ``uncordon`` ends the
  drain) or it leaves the fleet.

Each change of a watched worker marks it and wakes the wait, which reads the marked
workers' figures and sends those that differ from what it last sent: changes that come
while a message is being sent are folded into the next one. No timer runs. The wait ends
when every worker is over (drained: nothing in flight by any count this daemon has; gone:
its record left the view, or its engine's stream broke while it reported (no report, or
the daemon's own mark of a broken stream), as when it is killed before its lease runs
out, reported with what was in flight when last seen; or its drain ended: uncordoned),
or at the timeout, or when the daemon shuts down
(``close``: ``ShuttingDownError``).

What this daemon cannot see: another replica's requests on the worker, except through
the engine's figures (the engine counts every caller's requests, where it reports); and a
worker killed that never reported through an engine stream, until its lease runs out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import TracebackType

from dynamod.boundary.breaches import SOURCE as BOUNDARY
from dynamod.discovery.view import WorkerView
from dynamod.discovery_events import DiscoveryEvent, ViewResync
from dynamod.engine_events import REACH, EngineLoad
from dynamod.errors import ShuttingDownError
from dynamod.records import WorkerRecord
from dynamod.reports import DrainEvent, DrainStatus
from dynamod.results import InFlight, worker_state
from dynamod.router import Router
from dynamod.taints import DRAINING

Send = Callable[[DrainEvent], Awaitable[None]]
Resolve = Callable[[], list[WorkerRecord]]


class DrainWatch:
    """One wait for drained workers; see the module docstring.

    ``resolve`` names the workers to wait for; it is called once this daemon's view holds
    ``after_revision`` (the drain's own update: the view may lag the store by a moment).
    Listening starts when the ``with`` block is entered, so nothing between the drain's
    update and the wait is missed; ``run`` waits (once)."""

    def __init__(
        self, view: WorkerView, router: Router, resolve: Resolve, *, after_revision: int = 0
    ) -> None:
        self._view = view
        self._router = router
        self._resolve = resolve
        self._after = after_revision
        self._ids: dict[str, str] = {}  # key → instance id of those waited for, once resolved
        self._resolved = False
        self._sent: dict[str, DrainStatus] = {}
        self._marked: set[str] = set()
        self._woken = asyncio.Event()
        self._closed = False
        self._unlisten: list[Callable[[], None]] = []

    def __enter__(self) -> DrainWatch:
        self._unlisten = [self._view.listen(self._on_view), self._router.watch(self._mark)]
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        for stop in self._unlisten:
            stop()
        self._unlisten = []

    def close(self) -> None:
        """End the wait: the daemon is shutting down (``run`` raises ``ShuttingDownError``)."""
        self._closed = True
        self._woken.set()

    async def run(self, send: Send, deadline: float | None = None) -> DrainEvent:
        """Send every worker's figures, then each change, until the wait is over; return
        the last event (also sent). ``deadline``: the event loop's time (``loop.time()``)
        at which a wait not over ends as timed out; None for no limit. (A deadline, not an
        ``asyncio.timeout`` around the call: the last message must still be sent.)"""
        if not await self._until_view(deadline):
            return await self._end(send, (), timed_out=True)
        self._ids = {r.key: r.instance_id for r in self._resolve()}
        self._resolved = True
        self._marked.clear()
        changed = self._changes(set(self._ids))
        while not self._over:
            if changed:  # a wake may change nothing that shows (a taint of no concern)
                await send(DrainEvent(changed))
            if not await self._wake(deadline):
                return await self._end(send, self._busy(), timed_out=True)
            changed = self._changes(self._take())
        return await self._end(send, changed)

    # -- hearing about changes

    def _mark(self, key: str) -> None:
        if self._resolved:
            if key in self._ids:
                self._marked.add(key)
                self._woken.set()
        elif self._view.revision >= self._after:
            # Not resolved yet: only the view reaching the drain's revision matters, not
            # every request begun or ended meanwhile (each would wake every such wait).
            self._woken.set()

    def _on_view(self, event: DiscoveryEvent) -> None:
        if isinstance(event, ViewResync):
            self._marked.update(self._ids)
            self._woken.set()  # the view moved on: the revision awaited may be reached
        else:
            self._mark(event.record.key)

    async def _wake(self, deadline: float | None) -> bool:
        """Wait for a change; False when the deadline passed first."""
        try:
            async with asyncio.timeout_at(deadline):
                await self._woken.wait()
        except TimeoutError:
            return False
        self._woken.clear()
        if self._closed:
            raise ShuttingDownError(
                "dynamod is shutting down; the drain goes on (the workers stay cordoned): "
                "wait for it through another replica"
            )
        return True

    async def _until_view(self, deadline: float | None) -> bool:
        while self._view.revision < self._after:
            if not await self._wake(deadline):
                return False
        return True

    def _take(self) -> set[str]:
        marked, self._marked = self._marked, set()
        return marked

    # -- the figures

    def _status(self, key: str) -> DrainStatus:
        load, engine = self._router.load(key), self._router.reported(key)
        flight = InFlight.of(load, engine)
        record = self._view.get(key)
        before = self._sent.get(key)
        if before is not None and before.gone:
            return before  # gone stays gone, with what was in flight when it left
        lost = (  # its engine stopped reporting mid-drain: killed, its lease not yet out
            record is not None
            and _unheard(engine)
            and before is not None
            and before.draining
            and before.in_flight.running is not None
        )
        if record is None or lost:
            draining = before is None or before.draining
            taints = (DRAINING,) if draining else ()
            state = worker_state(taints, load, engine)
            left_with = flight if before is None else before.in_flight
            return DrainStatus(self._ids[key], key, state, left_with, draining, gone=True)
        state = worker_state(record.taints, load, engine)
        return DrainStatus(record.instance_id, key, state, flight, DRAINING in record.taints)

    def _changes(self, keys: set[str]) -> tuple[DrainStatus, ...]:
        """The figures of ``keys`` that differ from those last sent (all, the first time),
        by key; remembered as sent."""
        out = []
        for key in sorted(keys & self._ids.keys()):
            status = self._status(key)
            if self._sent.get(key) != status:
                self._sent[key] = status
                out.append(status)
        return tuple(out)

    @property
    def _over(self) -> bool:
        return all(status.over for status in self._sent.values())

    def _busy(self) -> tuple[DrainStatus, ...]:
        return tuple(s for _, s in sorted(self._sent.items()) if not s.drained)

    async def _end(
        self, send: Send, workers: tuple[DrainStatus, ...], *, timed_out: bool = False
    ) -> DrainEvent:
        drained = not timed_out and all(s.drained for s in self._sent.values())
        last = DrainEvent(workers, last=True, drained=drained, timed_out=timed_out)
        await send(last)
        return last


def _unheard(engine: EngineLoad | None) -> bool:
    """Nothing heard from the engine any more: no report (its stream ended), or this
    daemon's own mark of a stream that broke or a port that stopped answering."""
    return engine is None or (not engine.healthy and engine.source in (BOUNDARY, REACH))
