"""When each model lost its last worker, from the view's events: a request for a model
that had workers a moment ago (a store stall expiring leases, a rolling restart) gets a
retryable 503, not a 404 that says the model does not exist.

``Departures(window)`` follows the view (``follow(records)`` once, then ``apply(event)``
for every event, on the event loop); ``gone_since(model)`` is how many seconds ago the
model's last worker went away, while that is at most ``window`` seconds, else None. It
keeps the keys of each model's workers (no more than the view holds) and the models that
left within the window.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable

from dynamod.discovery_events import DiscoveryEvent, ViewResync, WorkerAdded, WorkerRemoved
from dynamod.records import WorkerRecord


class Departures:
    def __init__(self, window: float) -> None:
        self._window = window
        self._keys: dict[str, set[str]] = {}
        self._gone: OrderedDict[str, float] = OrderedDict()

    def follow(self, records: Iterable[WorkerRecord]) -> None:
        """Start from the view's records (or a resync's): a model served before and not in
        ``records`` has just lost its workers."""
        keys: dict[str, set[str]] = {}
        for record in records:
            keys.setdefault(record.model, set()).add(record.key)
        for model in self._keys.keys() - keys.keys():
            self._left(model)
        self._keys = keys

    def apply(self, event: DiscoveryEvent) -> None:
        if isinstance(event, ViewResync):
            self.follow(event.records)
        elif isinstance(event, WorkerAdded):
            self._keys.setdefault(event.record.model, set()).add(event.record.key)
            self._gone.pop(event.record.model, None)
        elif isinstance(event, WorkerRemoved):
            model = event.record.model
            keys = self._keys.get(model, set())
            keys.discard(event.record.key)
            if not keys:
                self._keys.pop(model, None)
                self._left(model)

    def gone_since(self, model: str) -> float | None:
        """Seconds since ``model`` lost its last worker, within the window; else None."""
        self._forget(time.monotonic())
        left = self._gone.get(model)
        return None if left is None else time.monotonic() - left

    def _left(self, model: str) -> None:
        now = time.monotonic()
        self._gone.pop(model, None)
        self._gone[model] = now  # newest last, so expired ones are at the front
        self._forget(now)

    def _forget(self, now: float) -> None:
        while self._gone and next(iter(self._gone.values())) < now - self._window:
            self._gone.popitem(last=False)
