"""The worker view: the always-current map of workers, and who hears about changes.

``WorkerView.run()`` watches the store and applies every discovery event to the map. Two
kinds of consumers hear about each change:

* *listeners* (``listen(callback)``): synchronous callbacks run in the watcher's task right
  after the map changed, in order. The router uses one: applying an event to its table
  and re-checking its queue is quick and must not lag the view.
* *subscriptions* (``subscribe(since=...)``): async iterators for slow consumers such as
  an operator's ``events tail``. Each has a queue bounded in events and in bytes; one
  that falls behind gets a ``ViewResync`` of the current view instead of the events it
  missed, so it never blocks the watcher and never silently misses a change. All queues
  together are bounded in bytes too: when they hold more than ``queues_budget``, the
  subscription furthest behind (the one holding the most bytes) is the one sent back to a
  ``ViewResync``, until the rest fit. A subscription can start from a revision: events
  after it are replayed from a ring buffer, or, when the buffer no longer reaches back
  that far, a ``ViewResync`` comes first.

Bytes are the view's one estimate of what keeping an event costs (``footprint``), the
same for the ring buffer and the queues; an event held by several queues counts in each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterator

from dynamod.catchup import CatchUpQueue
from dynamod.discovery.translate import EventTranslator
from dynamod.discovery_events import DiscoveryEvent, ViewResync
from dynamod.errors import AmbiguousWorkerError, WorkerNotFoundError
from dynamod.records import WORKERS_PREFIX, WorkerRecord
from dynamod.store import Store

log = logging.getLogger(__name__)

Listener = Callable[[DiscoveryEvent], None]
REPLAY = 10_000
REPLAY_BYTES = 64 * 1024 * 1024
SUBSCRIPTION_QUEUE = 1024
QUEUE_BYTES = 8 * 1024 * 1024
QUEUES_BUDGET = 64 * 1024 * 1024


class Subscription(CatchUpQueue[DiscoveryEvent]):
    """One consumer's events, as an async iterator (see the module docstring): its
    catch-up (``dynamod.catchup``) is a ``ViewResync`` of the view as it is then."""

    def __init__(self, view: WorkerView, maxsize: int, maxbytes: int) -> None:
        super().__init__(maxsize, maxbytes)
        self._view = view
        self.resyncs = 0

    def push(self, event: DiscoveryEvent, size: int) -> None:
        """Queue ``event`` (``size``: its ``footprint``), or, when that would take the queue
        past its bounds, fall behind: a ``ViewResync`` comes next instead."""
        if self.behind:
            pass  # the coming ViewResync, taken when it is read, covers this event too
        elif self.fits(size):
            self.put(event, size)
        else:
            self.fall_behind(drop_queued=True)

    async def catch_up(self, missed: int) -> DiscoveryEvent:
        self.resyncs += 1
        return self._view.snapshot()


class WorkerView:
    """Workers by store key, kept current by ``run()``; see the module docstring."""

    def __init__(
        self,
        store: Store,
        *,
        prefix: str = WORKERS_PREFIX,
        replay: int = REPLAY,
        replay_bytes: int = REPLAY_BYTES,
        queue_bytes: int = QUEUE_BYTES,
        queues_budget: int = QUEUES_BUDGET,
    ) -> None:
        """``replay`` / ``replay_bytes``: the replay ring of past events that ``since``
        replays from holds at most that many events and about that many bytes; the oldest
        go first (a subscription from before them starts with a ``ViewResync``).
        ``queue_bytes``: the bytes one subscription may hold queued; ``queues_budget``:
        all of them together (see the module docstring)."""
        self.store = store
        self.prefix = prefix
        self.ready = asyncio.Event()
        self._translator = EventTranslator()
        self._listeners: list[Listener] = []
        self._subscriptions: set[Subscription] = set()
        self._replay: deque[tuple[DiscoveryEvent, int]] = deque()
        self._replay_limits = (replay, replay_bytes)
        self._replay_size = 0
        self._queue_limits = (queue_bytes, queues_budget)
        self._stopped = False

    @property
    def revision(self) -> int:
        return self._translator.revision

    @property
    def refused(self) -> int:
        """How many store changes were refused (unreadable or immutable-field changes)."""
        return self._translator.refused

    def records(self) -> list[WorkerRecord]:
        known = self._translator.known
        return [known[k] for k in sorted(known)]

    def get(self, key: str) -> WorkerRecord | None:
        return self._translator.known.get(key)

    def revision_of(self, key: str) -> int:
        """The store revision of the worker's record as the view last saw it (0 if unknown)."""
        return self._translator.revisions.get(key, 0)

    def __len__(self) -> int:
        return len(self._translator.known)

    def find(self, ref: str) -> WorkerRecord:
        """A worker by store key, instance id, or a unique prefix of its instance id."""
        known = self._translator.known
        if ref in known:
            return known[ref]
        matches = [r for r in known.values() if r.instance_id.startswith(ref)] if ref else []
        exact = [r for r in matches if r.instance_id == ref]
        if exact or len(matches) == 1:
            return (exact or matches)[0]
        if matches:
            raise AmbiguousWorkerError(ref, sorted(r.instance_id for r in matches))
        raise WorkerNotFoundError(ref)

    def snapshot(self) -> ViewResync:
        return ViewResync(tuple(self.records()), self.revision)

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` with every event from now on; returns the way to stop."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    @contextlib.contextmanager
    def subscribe(
        self, *, since: int | None = None, maxsize: int = SUBSCRIPTION_QUEUE
    ) -> Iterator[Subscription]:
        """Events from now (``since=None``: a ``ViewResync`` of the current view first), or
        after revision ``since`` (replayed, or a ``ViewResync`` when too old)."""
        subscription = Subscription(self, maxsize, self._queue_limits[0])
        for event in self.backlog(since):
            subscription.push(event, footprint(event))
        if self._stopped:
            subscription.close()
        self._subscriptions.add(subscription)
        self._keep_queues_in_budget()
        try:
            yield subscription
        finally:
            subscription.close()
            self._subscriptions.discard(subscription)

    def backlog(self, since: int | None) -> list[DiscoveryEvent]:
        """What a subscription from ``since`` starts with: the events after it, or a
        ``ViewResync`` of the current view (when ``since`` is None or too old)."""
        if since is not None and self._replay and self._replay[0][0].revision <= since + 1:
            return [e for e, _ in self._replay if e.revision > since]
        if since is not None and since >= self.revision and self.ready.is_set():
            return []
        return [self.snapshot()] if self.ready.is_set() else []

    async def run(self) -> None:
        """Watch the store until cancelled (or the store closes), keeping the view current."""
        try:
            async with self.store.watch(self.prefix) as watch:
                async for store_event in watch:
                    for event in self._translator.translate(store_event):
                        self._publish(event)
        finally:
            self._stopped = True
            for subscription in list(self._subscriptions):
                subscription.close()

    def _publish(self, event: DiscoveryEvent) -> None:
        size = footprint(event)
        self._remember(event, size)
        for listener in list(self._listeners):
            listener(event)
        for subscription in self._subscriptions:
            subscription.push(event, size)
        self._keep_queues_in_budget()
        if isinstance(event, ViewResync) and not self.ready.is_set():
            self.ready.set()
            log.info("worker view ready: %d workers at revision %d", len(self), event.revision)

    def _keep_queues_in_budget(self) -> None:
        """While all queues together hold more than the budget, send the subscription
        holding the most back to a ``ViewResync``."""
        budget = self._queue_limits[1]
        total = sum(s.queued_bytes for s in self._subscriptions)
        while total > budget:
            furthest = max(self._subscriptions, key=lambda s: s.queued_bytes)
            total -= furthest.queued_bytes
            furthest.fall_behind(drop_queued=True)

    def _remember(self, event: DiscoveryEvent, size: int) -> None:
        self._replay.append((event, size))
        self._replay_size += size
        count, budget = self._replay_limits
        while len(self._replay) > count or (self._replay_size > budget and len(self._replay) > 1):
            self._replay_size -= self._replay.popleft()[1]

    async def wait_for(
        self, predicate: Callable[[WorkerView], bool], *, within: float = 10.0
    ) -> None:
        """Wait until ``predicate(view)`` holds, re-checking at every change."""
        async with asyncio.timeout(within):
            with self.subscribe() as events:
                if predicate(self):
                    return
                async for _ in events:
                    if predicate(self):
                        return


def footprint(event: DiscoveryEvent) -> int:
    """About how many bytes keeping ``event`` may cost: its records, once the view has moved
    on from them. A record's size is dominated by its taints (CPython: ~50 bytes per str
    plus its characters); a resync holds every record of its time."""
    records = event.records if isinstance(event, ViewResync) else (event.record,)
    return 64 + sum(1024 + sum(len(t) + 64 for t in r.taints) for r in records)
