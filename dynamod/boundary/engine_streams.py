"""Following every worker's engine events: one task per worker that offers them.

``EngineStreams(view, report).run()`` owns one task group: a task per worker whose record
offers an events stream (``engine_events.offered_path``), started when the view adds the
worker and cancelled when it removes it. Each task connects to the worker's system address
and hands every state it reads to ``report(key, state)``, through ``breaches``
(``boundary/breaches.py``), which holds them back while the worker is marked.

**Any fleet size.** A stream is one long-lived connection of its own, opened by
``http/stream_get.py`` (a small HTTP/1.1 reader: no pool, so no cap like aiohttp's default
of 100 connections in all, which left every worker past the hundredth waiting for one and
marked ``timeout``; and a few hundred bytes of objects a connection, where aiohttp's client
took some 14 KB). What bounds them is the daemon's open files (``dynamod/open_files.py``): with
``open_files``, no more streams are open at once than its ``streams`` (the soft limit less
a reserve for the store, gRPC and the front); a worker past that is refused its stream,
counted in ``dynamod_engine_streams_refused_total`` and logged (summarised, like breaches:
``boundary/breach_log.py``), and retried after its back-off; it is not marked (the router
falls back on its own count). ``dynamod_engine_streams_open`` is how many are open now.

**Connecting.** At most ``CONNECTING`` streams are being opened at once (connected, and
waiting for their snapshot line); the others wait their turn before their clock starts,
so a daemon that starts beside 10,000 workers, or a partition that heals, does not spend
its loop on 10,000 handshakes at once and charge each a timeout for the wait. A stream
leaves the gate with its first line, or when its attempt fails. Together with each
worker's back-off (full jitter), reconnections are spread out.

**The boundary.** Every line is read within the worker's ``Budgets``
(``boundary/budgets.py``): its length, its rate (a budget per worker that survives its
reconnections), the time to connect and to each line. Whatever the worker's bytes do — a
line too long, not JSON, a wrong type, too fast, too slow, a stream that ends before it made
progress, or any exception at all while they are handled — costs that worker's connection
and nothing else: the task logs it, marks the worker (a ``Breach``: unhealthy for the
router, with the reason in listings) and reconnects after its back-off. Only
``CancelledError`` leaves the task, so nothing a worker sends can end the task group, let
alone the daemon. A worker that cannot be reached at all, answers another status than 200
or closes its connection mid-answer (a ``ConnectionError``), is not marked: the router
falls back on its own count (``None``: nothing known). Its HTTP is held to the reader's
bounds too: a head or a chunk size line over its cap is ``oversize``, framing that is not
HTTP/1.1 or a body in a ``Content-Encoding`` (never inflated) is ``malformed``.

**A worker's KV snapshot.** A worker whose record offers KV events gets a byte burst that
takes its whole KV snapshot — as many blocks as the KV index keeps for it
(``KvIndexer.limit``), at ``SNAPSHOT_BLOCK_BYTES`` plus ``SNAPSHOT_TOKEN_BYTES`` a token —
when that is larger than ``budgets.bytes_burst``: a large engine that reconnects is not
flooding.

**Back-off.** ``dynamod.backoff.Backoff(BACKOFF_FIRST, BACKOFF_CAP)`` per worker, reset only
on *real progress*: a connection that stayed up ``budgets.progress`` seconds past its
snapshot, every line within budget. Then the mark, if any, is lifted too. A snapshot alone
is not progress: a worker that accepts and breaks every connection is retried at the
back-off's pace (a delay drawn from up to ``BACKOFF_CAP`` seconds), not at full speed.

Memory is bounded: one task, one rate budget and one state per live worker, one line
(``budgets.line`` bytes) and what was received but not yet read (``stream_get.HIGH_WATER``
and one read of the socket: then TCP holds the worker back) per connection, no queue (a
state replaces the last). An idle stream costs some 6 KB of Python objects, 14 KB of RSS
(``python -m bench.stream_memory``). What the connections' buffers hold together is a
claim each on the daemon's memory budget (``memory``: ``http.memory``, shared with the
front's answers and the tokenizer fetches): past it the connection holding the most is
closed and retried after its back-off, one warning line, the worker not marked (the limit
is the daemon's, not its fault).

With a ``KvIndexer`` (``kv``), the KV lines of a worker that offers them go to the router's
KV index (``boundary/kv_indexer.py``): the first of each connection attaches the worker
(its whole cache follows), every one is applied as it arrives, and the end of the
connection detaches it. Without one, KV lines are read and dropped (approximate mode only).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import replace

from prometheus_client import CollectorRegistry, Counter, Gauge

from dynamod.backoff import Backoff
from dynamod.boundary.breaches import Breach, Breaches, BreachKind, kind_of
from dynamod.boundary.budgets import Budgets, RateBudget
from dynamod.boundary.events_stream import events
from dynamod.boundary.kv_indexer import KvIndexer
from dynamod.discovery.view import WorkerView
from dynamod.discovery_events import (
    DiscoveryEvent,
    ViewResync,
    WorkerAdded,
    WorkerModified,
    WorkerRemoved,
)
from dynamod.engine_events import EngineLoad, LoadReport, offered_path, offers_kv
from dynamod.errors import DynamoError, MemoryBudgetError
from dynamod.http.memory import MemoryBudget
from dynamod.kv_events import KvBatch
from dynamod.open_files import OpenFiles
from dynamod.records import WorkerRecord

log = logging.getLogger(__name__)

BACKOFF_FIRST = 0.2
BACKOFF_CAP = 5.0
SNAPSHOT_BLOCK_BYTES = 24
SNAPSHOT_TOKEN_BYTES = 8
SNAPSHOT_BLOCK_SIZE = 64
"""A block of a KV snapshot line takes at most ``SNAPSHOT_BLOCK_BYTES`` (its hash) plus
``SNAPSHOT_TOKEN_BYTES`` a token (ids of up to 7 digits); block sizes past
``SNAPSHOT_BLOCK_SIZE`` count as that (a record's card is the worker's word)."""
CONNECTING = 128
"""Streams being opened at once (see the module docstring)."""


class EngineStreams:
    """The daemon's subscriptions to its workers' engine events; see the module docstring.

    ``breaches``: the marks to share with the daemon's other readers of workers' bytes;
    by default its own, reporting to ``report``, its metrics in ``registry``.
    ``open_files``: the bound on streams open at once (none without it).
    """

    def __init__(
        self,
        view: WorkerView,
        report: LoadReport,
        *,
        budgets: Budgets | None = None,
        kv: KvIndexer | None = None,
        registry: CollectorRegistry | None = None,
        breaches: Breaches | None = None,
        rng: random.Random | None = None,
        open_files: OpenFiles | None = None,
        memory: MemoryBudget | None = None,
    ) -> None:
        self._view = view
        self._memory = memory if memory is not None else MemoryBudget()
        self._open_files = open_files
        self._opening = 0
        """Streams connecting or open now: what ``open_files`` bounds."""
        self._connecting = asyncio.Semaphore(CONNECTING)
        self._kv = kv
        self._budgets = budgets or Budgets()
        self._rng = rng or random.Random()
        self.breaches = breaches or Breaches(report, registry)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._group: asyncio.TaskGroup | None = None
        self.connected: set[str] = set()
        """Keys of the workers whose stream is open now (read it; for listings, tests)."""
        self._refused = Counter(
            "dynamod_engine_streams_refused",
            "Engine streams not opened: the daemon's open files were at their bound.",
            registry=registry,
        )
        if registry is not None:
            Gauge(
                "dynamod_engine_streams_open",
                "Workers whose engine events stream the daemon has open now.",
                registry=registry,
            ).set_function(lambda: len(self.connected))

    def __len__(self) -> int:
        return len(self._tasks)

    async def run(self) -> None:
        """Follow the workers until cancelled; every task ends with this call."""
        async with asyncio.TaskGroup() as group:
            self._group = group
            group.create_task(self.breaches.lines.run(), name="breach log")
            unlisten = self._view.listen(self._on_event)
            try:
                self._reconcile(self._view.records())
                await asyncio.get_running_loop().create_future()  # until cancelled
            finally:
                unlisten()
                for key in list(self._tasks):
                    self._stop(key)
                self._group = None

    def _on_event(self, event: DiscoveryEvent) -> None:
        if isinstance(event, WorkerAdded):
            self._start(event.record)
        elif isinstance(event, WorkerRemoved):
            self._stop(event.record.key)
        elif isinstance(event, ViewResync):
            self._reconcile(event.records)
        elif not isinstance(event, WorkerModified):
            raise TypeError(f"unknown discovery event {event!r}")

    def _reconcile(self, records: tuple[WorkerRecord, ...] | list[WorkerRecord]) -> None:
        live = {r.key: r for r in records}
        for key in [k for k in self._tasks if k not in live]:
            self._stop(key)
        for record in live.values():
            self._start(record)

    def _start(self, record: WorkerRecord) -> None:
        path = offered_path(record)
        if path is None or record.key in self._tasks or self._group is None:
            return
        name = f"engine feed {record.instance_id}"
        self._tasks[record.key] = self._group.create_task(self._follow(record, path), name=name)

    def _stop(self, key: str) -> None:
        task = self._tasks.pop(key, None)
        if task is not None:
            task.cancel()  # the group awaits it; _follow forgets the worker on the way out

    async def _follow(self, record: WorkerRecord, path: str) -> None:
        url = record.system_address.rstrip("/") + path
        feed = _Feed(record, url, worker_budgets(self._budgets, record, self._kv), self._rng)
        try:
            while True:
                await self._connection(feed)
                await feed.backoff.wait()
        finally:
            self.connected.discard(record.key)
            self.breaches.forget(record.key)

    async def _connection(self, feed: _Feed) -> None:
        """Follow one connection to its end; mark the worker if its bytes broke the
        boundary. Raises nothing but ``CancelledError``."""
        key = feed.record.key
        feed.opened, feed.progressed = None, False
        if not self._admit(feed):
            return
        self._opening += 1
        gated = False
        claim = self._memory.claim(f"the engine events of worker {key}")
        try:
            await self._connecting.acquire()
            gated = True
            with claim as held:
                stream = events(feed.url, self._budgets, feed.rate, held)
                async with contextlib.aclosing(stream):  # its connection closed here, not by GC
                    async for event in stream:
                        if gated:
                            self._connecting.release()
                            gated = False
                        self._deliver(feed, event)
            self._ended(feed, None)
        except Exception as exc:  # noqa: BLE001 - whatever a worker's bytes raise ends here
            self._ended(feed, exc)
        finally:
            if gated:
                self._connecting.release()
            self._opening -= 1
            if self._kv is not None:
                self._kv.gone(key)
            self.connected.discard(key)

    def _admit(self, feed: _Feed) -> bool:
        """Whether one more stream fits the daemon's open files; counted and logged when not."""
        if self._open_files is None:
            return True
        bound = self._open_files.streams
        if self._opening < bound:
            return True
        self._refused.inc()
        key = feed.record.key
        line = (
            f"worker {key}: engine stream not opened: {self._opening} are open, the most "
            f"that fit the open files limit ({bound}: the soft limit less "
            f"{self._open_files.reserve} kept for the rest); raise LimitNOFILE"
        )
        self.breaches.lines.note("were refused an engine stream (open files)", key, line)
        self.breaches.report(key, None)
        return False

    def _deliver(self, feed: _Feed, event: EngineLoad | KvBatch | None) -> None:
        """Count the line toward the connection's progress (a heartbeat too: an idle
        worker's stream is real progress), then apply what it carries."""
        key, now = feed.record.key, time.monotonic()
        if feed.opened is None:
            if event is None:
                return  # the connection counts from its snapshot
            feed.opened = now
            self.connected.add(key)
        elif not feed.progressed and now - feed.opened >= self._budgets.progress:
            feed.progressed = True
            feed.backoff.reset()
            self.breaches.clear(key)
        if event is None:
            return
        if isinstance(event, EngineLoad):
            self.breaches.report(key, event)
        elif self._kv is not None:
            if not self._kv.index.follows(key):
                self._kv.connected(feed.record)
            self._kv.batch(key, event)

    def _ended(self, feed: _Feed, error: Exception | None) -> None:
        """Judge how a connection ended: a breach, or nothing known."""
        key = feed.record.key
        if isinstance(error, MemoryBudgetError):  # logged by the budget; retried, unmarked
            self.breaches.report(key, None)
        elif isinstance(error, TimeoutError):
            message = f"it sent no whole line within {self._budgets.stall:g} s"
            self.breaches.breach(Breach(key, BreachKind.TIMEOUT, message))
        elif isinstance(error, DynamoError) and not isinstance(error, ConnectionError):
            self.breaches.breach(Breach(key, kind_of(error), str(error)))
        elif error is not None and not isinstance(error, OSError):
            log.warning("engine events of %s raised %r", feed.url, error, exc_info=error)
            message = f"handling its events raised {error!r}"
            self.breaches.breach(Breach(key, BreachKind.MALFORMED, message))
        elif feed.opened is not None and not feed.progressed:
            lasted = time.monotonic() - feed.opened
            message = f"its events stream ended {lasted:.1f} s after it opened"
            self.breaches.breach(Breach(key, BreachKind.UNSTABLE, message))
        else:
            log.debug("engine events of %s ended (%r); reconnecting", feed.url, error)
            self.breaches.report(key, None)


def worker_budgets(budgets: Budgets, record: WorkerRecord, kv: KvIndexer | None) -> Budgets:
    """The budgets of ``record``'s worker: ``budgets``, with a byte burst and a KV event
    burst that take its whole KV snapshot when that is larger (see the module docstring)."""
    if kv is None or not offers_kv(record):
        return budgets
    size = min(max(record.model_card.kv_block_size, 1), SNAPSHOT_BLOCK_SIZE)
    snapshot = kv.limit(record) * (SNAPSHOT_BLOCK_BYTES + SNAPSHOT_TOKEN_BYTES * size)
    return replace(
        budgets,
        bytes_burst=max(budgets.bytes_burst, snapshot),
        kv_events_burst=max(budgets.kv_events_burst, kv.limit(record)),  # a block an event
    )


class _Feed:
    """One worker's feed across its reconnections: its back-off and rate budget, and how
    far the current connection got."""

    def __init__(
        self, record: WorkerRecord, url: str, budgets: Budgets, rng: random.Random
    ) -> None:
        self.record = record
        self.url = url
        self.backoff = Backoff(BACKOFF_FIRST, BACKOFF_CAP, rng=rng)
        self.rate = RateBudget(budgets)
        self.opened: float | None = None
        """When the current connection's snapshot came (monotonic); None before."""
        self.progressed = False
