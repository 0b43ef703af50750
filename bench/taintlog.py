"""The taint log: every state every worker's taints went through, as one process's
``WorkerView`` applied it, stamped with ``time.monotonic_ns()`` — what ``bench.load`` and the
chaos scenarios judge each request against (``bench/load.py``'s docstring says how)."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass

from dynamod.discovery.view import WorkerView
from dynamod.discovery_events import DiscoveryEvent, ViewResync, WorkerRemoved
from dynamod.store import Store
from dynamod.taints import RoutingConstraints, caller_taints, matches
from dynamod.tasks import cancel_and_wait

SETTLE_TIMEOUT = 20.0
"""Seconds the log's view may take to sync on entry."""

Taints = frozenset[str] | None
"""A worker's taints at some moment; ``None`` while it is not in the view."""


@dataclass(frozen=True)
class Change:
    at_ns: int
    revision: int
    key: str
    taints: Taints


class TaintLog:
    """Every state of every worker as this process's view applied it (see the module
    docstring). Feed it with ``view.listen(log.on_event)``.

    Events the view publishes in one go, without the event loop running anything else in
    between (a store ``Resync`` becomes several), share one time stamp: nothing can have
    seen the states between them, so they count as one change of the fleet.
    """

    def __init__(self) -> None:
        self.changes: list[Change] = []
        self.started_ns: int | None = None
        self._by_key: dict[str, list[Change]] = {}
        self._current: dict[str, frozenset[str]] = {}
        self._ids: dict[str, str] = {}
        self._batch_ns: int | None = None

    def _stamp(self) -> int:
        if self._batch_ns is None:
            self._batch_ns = time.monotonic_ns()
            asyncio.get_running_loop().call_soon(self._end_batch)
        if self.started_ns is None:
            self.started_ns = self._batch_ns
        return self._batch_ns

    def _end_batch(self) -> None:
        self._batch_ns = None

    def on_event(self, event: DiscoveryEvent) -> None:
        now = self._stamp()
        if isinstance(event, ViewResync):
            fresh = {r.key: frozenset(r.taints) for r in event.records}
            self._ids.update((r.instance_id, r.key) for r in event.records)
            for key in sorted(set(self._current) | set(fresh)):
                self._record(now, event.revision, key, fresh.get(key))
            return
        record = event.record
        self._ids[record.instance_id] = record.key
        gone = isinstance(event, WorkerRemoved)
        self._record(now, event.revision, record.key, None if gone else frozenset(record.taints))

    def _record(self, at_ns: int, revision: int, key: str, taints: Taints) -> None:
        if self._current.get(key) == taints:
            return
        if taints is None:
            del self._current[key]
        else:
            self._current[key] = taints
        change = Change(at_ns, revision, key, taints)
        self.changes.append(change)
        self._by_key.setdefault(key, []).append(change)

    def current(self) -> dict[str, frozenset[str]]:
        return dict(self._current)

    def held_since(self, key: str, caller: tuple[str, ...], since_ns: int) -> bool:
        """Whether the worker's caller-managed taints became exactly ``caller`` at some
        change applied at or after ``since_ns``."""
        return any(
            c.at_ns >= since_ns and c.taints is not None and caller_taints(c.taints) == caller
            for c in self._by_key.get(key, [])
        )

    def key_of(self, worker_id: str) -> str | None:
        return self._ids.get(worker_id)

    def state_at(self, key: str, at_ns: int) -> Taints:
        history = self._by_key.get(key, [])
        index = bisect.bisect_right([c.at_ns for c in history], at_ns)
        return history[index - 1].taints if index else None

    def states(self, key: str, start_ns: int, end_ns: int) -> list[Taints]:
        """The state at ``start_ns`` and every later one up to ``end_ns``."""
        later = [c.taints for c in self._by_key.get(key, []) if start_ns < c.at_ns <= end_ns]
        return [self.state_at(key, start_ns), *later]

    def nobody_satisfied(self, constraints: RoutingConstraints, start: int, end: int) -> bool:
        """Whether, at some moment in ``[start, end]``, no worker satisfied ``constraints``."""
        fleet = {k: self.state_at(k, start) for k in self._by_key}
        eligible = {k for k, t in fleet.items() if t is not None and matches(t, constraints)}
        if not eligible:
            return True
        batches = _batches(c for c in self.changes if start < c.at_ns <= end)
        for batch in batches:
            for change in batch:
                if change.taints is not None and matches(change.taints, constraints):
                    eligible.add(change.key)
                else:
                    eligible.discard(change.key)
            if not eligible:
                return True
        return False


def _batches(changes: Iterable[Change]) -> Iterator[list[Change]]:
    """Changes grouped by the moment they were applied: a resync is applied as one."""
    batch: list[Change] = []
    for change in changes:
        if batch and change.at_ns != batch[0].at_ns:
            yield batch
            batch = []
        batch.append(change)
    if batch:
        yield batch


@contextlib.asynccontextmanager
async def taint_log(store: Store) -> AsyncIterator[tuple[TaintLog, WorkerView]]:
    """A ``WorkerView`` of ``store`` feeding a ``TaintLog``, synced on entry."""
    log = TaintLog()
    view = WorkerView(store)
    view.listen(log.on_event)
    task = asyncio.create_task(view.run(), name="load generator worker view")
    try:
        async with asyncio.timeout(SETTLE_TIMEOUT):
            await view.ready.wait()
        yield log, view
    finally:
        await cancel_and_wait(task)
