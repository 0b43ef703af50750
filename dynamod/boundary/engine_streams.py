"""Following every worker's engine events: one task per worker that offers them.

``EngineStreams(view, report).run()`` owns one ``aiohttp`` session and one task group: a task per
worker whose record offers an events stream (``reported.offered_path``), started when the
view adds the worker and cancelled when it removes it. Each task connects to the
worker's system address, hands every state it reads to ``report(key, state)`` and, when
the stream breaks or stalls (``stall`` seconds without even a heartbeat), reports
``None`` (nothing known: the router falls back on its own count) and reconnects after a
back-off (``BACKOFF_MIN`` doubling to ``BACKOFF_MAX``, with jitter); the snapshot a
worker sends on every connect makes a reconnect whole again. Memory is bounded: one
task and one state per live worker, no queue (a state replaces the last).

With a ``KvIndexer`` (``kv``), the KV lines of a worker that offers them go to the router's
KV index (``feed/kv.py``): the first of each connection attaches the worker (its whole
cache follows), every one is applied as it arrives, and the end of the connection
detaches it. Without one, KV lines are read and dropped (approximate mode only).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable

import aiohttp

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
from dynamod.engine_events import HEARTBEAT, EngineLoad, offered_path
from dynamod.errors import InvalidInputError
from dynamod.records import WorkerRecord

log = logging.getLogger(__name__)

Report = Callable[[str, EngineLoad | None], None]
BACKOFF_MIN = 0.2
BACKOFF_MAX = 5.0
STALL = 3 * HEARTBEAT


class EngineStreams:
    """The daemon's subscriptions to its workers' engine events; see the module docstring."""

    def __init__(
        self,
        view: WorkerView,
        report: Report,
        *,
        stall: float = STALL,
        rng: random.Random | None = None,
        kv: KvIndexer | None = None,
    ) -> None:
        self._view = view
        self._report = report
        self._kv = kv
        self._stall = stall
        self._rng = rng or random.Random()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._group: asyncio.TaskGroup | None = None
        self._session: aiohttp.ClientSession | None = None
        self.connected: set[str] = set()
        """Keys of the workers whose stream is open now (read it; for listings, tests)."""

    def __len__(self) -> int:
        return len(self._tasks)

    async def run(self) -> None:
        """Follow the workers until cancelled; every task ends with this call."""
        async with aiohttp.ClientSession() as session, asyncio.TaskGroup() as group:
            self._session, self._group = session, group
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
            task.cancel()  # the group awaits it; _follow reports None on the way out

    async def _follow(self, record: WorkerRecord, path: str) -> None:
        key, url = record.key, record.system_address.rstrip("/") + path
        delay = BACKOFF_MIN
        try:
            while True:
                if await self._read(record, url):
                    delay = BACKOFF_MIN
                await asyncio.sleep(delay * self._rng.uniform(0.5, 1.0))
                delay = min(delay * 2, BACKOFF_MAX)
        finally:
            self.connected.discard(key)
            self._report(key, None)

    async def _read(self, record: WorkerRecord, url: str) -> bool:
        """Follow one connection to its end; whether it delivered any state."""
        assert self._session is not None
        key, kv = record.key, self._kv
        delivered = False
        try:
            async for event in events(self._session, url, stall=self._stall):
                self.connected.add(key)
                delivered = True
                if isinstance(event, EngineLoad):
                    self._report(key, event)
                elif kv is not None:
                    if not kv.index.follows(key):
                        kv.connected(record)
                    kv.batch(key, event)
            log.debug("engine events of %s ended; reconnecting", url)
        except (aiohttp.ClientError, TimeoutError, InvalidInputError, OSError) as exc:
            log.debug("engine events of %s broke (%s); reconnecting", url, exc or type(exc))
        finally:
            if kv is not None:
                kv.gone(key)
        self.connected.discard(key)
        self._report(key, None)
        return delivered
