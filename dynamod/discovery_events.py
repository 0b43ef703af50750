"""Discovery events: what a watcher of the worker view sees.

``WorkerAdded``, ``WorkerModified`` (the one change a registered record may undergo: its
taints; ``added`` / ``removed`` say which), ``WorkerRemoved``, and ``ViewResync`` (the whole
view, after the first snapshot, a reconnect or an overflow). Every event carries the store
revision it reflects, and the wall-clock time this process saw it (``seen``, not part of
equality). ``discovery.translate`` makes them from store events; the router, the front,
the engine streams and ``events tail`` consume them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from dynamod.records import WorkerRecord


def _now() -> float:
    return time.time()


@dataclass(frozen=True)
class WorkerAdded:
    record: WorkerRecord
    revision: int
    seen: float = field(default_factory=_now, compare=False)


@dataclass(frozen=True)
class WorkerRemoved:
    record: WorkerRecord
    revision: int
    seen: float = field(default_factory=_now, compare=False)


@dataclass(frozen=True)
class WorkerModified:
    record: WorkerRecord
    added: tuple[str, ...]
    removed: tuple[str, ...]
    revision: int
    seen: float = field(default_factory=_now, compare=False)

    @property
    def taints(self) -> tuple[str, ...]:
        return self.record.taints


@dataclass(frozen=True)
class ViewResync:
    """The whole view, after the first snapshot or a reconnect / overflow."""

    records: tuple[WorkerRecord, ...]
    revision: int
    seen: float = field(default_factory=_now, compare=False)


DiscoveryEvent = WorkerAdded | WorkerRemoved | WorkerModified | ViewResync
