"""The daemon's one policy for a worker that breaks its boundary.

A reader of a worker's bytes (its engine events stream today; its tokenizer bundle and
the answers the front relays may adopt it) that refuses what the worker sent builds a
``Breach`` — the worker's key, the ``BreachKind``, a message — and hands it to
``Breaches.breach``. That:

* logs it through ``BreachLog`` (``boundary/breach_log.py``): the first of its kind in an
  interval as one line naming the worker and the breach, the rest of the interval as one
  summary line with counts and a few ids (a partition of thousands of workers costs a few
  lines, not thousands); lifted marks alike;
* counts it: ``dynamod_worker_breaches_total{kind}``; ``dynamod_workers_marked`` is how
  many workers are marked now;
* *marks* the worker: the router hears an unhealthy ``EngineLoad`` (``source="boundary"``,
  ``reason`` naming the breach) instead of what the worker reports, so no new request goes
  there, and ``dynamoctl workers ls -o json`` / ``workers get`` show why (the engine's
  ``healthy`` / ``reason``, the path an unhealthy engine always took: no API change).

The reader itself drops that worker's connection and retries after its back-off; nothing
else is disturbed. A mark stays until the reader sees real progress (``clear``: a
connection that stayed up and within budget for a while, ``boundary/budgets.py``) or the
worker leaves (``forget``); what the worker reports meanwhile is kept, and reported when
the mark is lifted.

Event-loop thread only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Gauge

from dynamod.boundary.breach_log import BreachLog
from dynamod.boundary.budgets import TooFastError
from dynamod.engine_events import MAX_REASON, EngineLoad, LoadReport
from dynamod.errors import OversizeError

log = logging.getLogger(__name__)

SOURCE = "boundary"
"""``EngineLoad.source`` of a mark: the figures are the daemon's verdict, not the engine's."""


class BreachKind(StrEnum):
    OVERSIZE = "oversize"
    """A line, body or bundle over its byte budget."""
    MALFORMED = "malformed"
    """Bytes that break the protocol: not JSON, wrong types, a gap in a numbered sequence."""
    TOO_FAST = "too_fast"
    """More events or bytes a second than its rate budget."""
    TIMEOUT = "timeout"
    """Silent past its time budget: no connection, no line."""
    UNSTABLE = "unstable"
    """Its stream ended before it made real progress (one that accepts, then breaks)."""


@dataclass(frozen=True)
class Breach:
    """``worker`` (its store key) broke the boundary: ``kind``, and ``message`` saying how."""

    worker: str
    kind: BreachKind
    message: str

    @property
    def reason(self) -> str:
        """The mark's ``EngineLoad.reason``: what listings show (UTF-8 whatever the message
        quotes, cut to ``MAX_REASON``)."""
        text = f"broke the daemon's boundary ({self.kind}): {self.message}"[:MAX_REASON]
        return text.encode("utf-8", "backslashreplace").decode()[:MAX_REASON]


def kind_of(error: BaseException) -> BreachKind:
    """The breach an exception raised while reading a worker's bytes stands for."""
    if isinstance(error, OversizeError):
        return BreachKind.OVERSIZE
    if isinstance(error, TooFastError):
        return BreachKind.TOO_FAST
    if isinstance(error, TimeoutError):
        return BreachKind.TIMEOUT
    return BreachKind.MALFORMED


class Breaches:
    """Marks on workers that broke the boundary, between the readers and the router
    (``report``); see the module docstring. ``registry``: where the metrics go;
    ``lines``: where the log lines go (by default a ``BreachLog`` of this module's logger,
    whose ``run`` the owner of these marks runs)."""

    def __init__(
        self,
        report: LoadReport,
        registry: CollectorRegistry | None = None,
        *,
        lines: BreachLog | None = None,
    ) -> None:
        self._report = report
        self.lines = lines or BreachLog(log)
        self._marks: dict[str, Breach] = {}
        self._latest: dict[str, EngineLoad | None] = {}
        registry = registry if registry is not None else CollectorRegistry()
        self._count = Counter(
            "dynamod_worker_breaches",
            "Times a worker broke the daemon's boundary, by kind.",
            ["kind"],
            registry=registry,
        )
        for kind in BreachKind:
            self._count.labels(kind.value)
        marked = Gauge(
            "dynamod_workers_marked",
            "Workers marked unhealthy now for breaking the daemon's boundary.",
            registry=registry,
        )
        marked.set_function(lambda: len(self._marks))

    def __len__(self) -> int:
        """Workers marked now."""
        return len(self._marks)

    def last(self, worker: str) -> Breach | None:
        """The breach ``worker`` is marked for, if it is."""
        return self._marks.get(worker)

    def report(self, worker: str, load: EngineLoad | None) -> None:
        """What ``worker`` reports: to the router, unless it is marked (then kept)."""
        if worker in self._marks:
            if load is not None:
                self._latest[worker] = load
            return
        self._report(worker, load)

    def breach(self, breach: Breach) -> None:
        """Count, log and mark; see the module docstring."""
        self._count.labels(breach.kind.value).inc()
        key, was = breach.worker, self._marks.get(breach.worker)
        if was is None:
            self._latest[key] = None
        # A change of verdict is logged (summarised at fleet scale); a worker that keeps
        # breaking the same way (every reconnection, spread by the back-off) is counted.
        if was is not None and was.kind == breach.kind:
            log.debug("worker %s %s", key, breach.reason)
        else:
            line = f"worker {key} {breach.reason}"
            self.lines.note(f"were marked ({breach.kind})", key, line)
        self._marks[key] = breach
        self._report(key, EngineLoad(healthy=False, reason=breach.reason, source=SOURCE))

    def clear(self, worker: str) -> None:
        """``worker`` made real progress: lift its mark, report what it said last."""
        if self._marks.pop(worker, None) is not None:
            line = f"worker {worker} is within the daemon's boundary again"
            self.lines.note("are within the daemon's boundary again", worker, line, logging.INFO)
            self._report(worker, self._latest.pop(worker, None))

    def forget(self, worker: str) -> None:
        """``worker`` is gone: no mark, nothing known."""
        self._marks.pop(worker, None)
        self._latest.pop(worker, None)
        self._report(worker, None)
