"""Whether each NVIDIA Dynamo worker can be reached: what Dynamo's frontend routes by.

A Dynamo worker tells a third party nothing of its health, and its record stays on its
lease for the lease's TTL (30 s in 1.6.1) after it died. Dynamo's frontend holds a
connection to each worker's request plane and stops routing to one the moment that
connection breaks. ``DynamoReach`` does the same, so that what dynamod shows is what
Dynamo routes by:

* one task per Dynamo worker (started and stopped by the view's events) holds one idle
  TCP connection to its system port, where its taint route is (its request plane's
  address when it has none). It sends nothing and reads one byte at most: Dynamo never
  writes on it, so the read ends only when the connection does. A worker that dies
  (SIGKILL, a crash) has its kernel reset the connection at once;
* the task then connects again. Refused (or not accepted within ``CONNECT_WITHIN``), the
  worker is marked ``unreachable``: ``report(key, EngineLoad(healthy=False,
  source=REACH))``, through the same sink as an engine's report, so it is not routable,
  not counted by the pools, left out by ``route explain``. The mark stays until a
  connection is made again (``report(key, None)``) or the worker's lease ends (its record
  goes, and the task with it);
* between attempts, the one back-off (``FIRST`` to ``CAP``); only a connection that stayed
  up ``STEADY`` seconds resets it, so a peer that accepts and closes at once is not
  hammered. TCP keep-alive (``KEEPALIVE``) finds a host that vanished without a reset.

A peer that writes to the connection has it closed and made again after the back-off:
what it sends is never read beyond one byte. Each connection is one file descriptor of
the daemon's: a fleet of N Dynamo workers holds N.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
from typing import Final
from urllib.parse import urlsplit

from dynamod.backoff import Backoff
from dynamod.discovery.view import WorkerView
from dynamod.discovery_events import (
    DiscoveryEvent,
    ViewResync,
    WorkerAdded,
    WorkerModified,
    WorkerRemoved,
)
from dynamod.engine_events import REACH, EngineLoad, LoadReport
from dynamod.records import WorkerRecord

log = logging.getLogger(__name__)

FIRST: Final = 0.1
CAP: Final = 2.0
STEADY: Final = 1.0
"""Seconds a connection must stay up to count as progress (the back-off starts over)."""
CONNECT_WITHIN: Final = 2.0
DEFAULT_PORTS: Final = {"http": 80, "https": 443}
KEEPALIVE: Final = (10, 5, 3)
"""TCP keep-alive: idle seconds before the first probe, seconds between probes, probes."""


class DynamoReach:
    """One connection per Dynamo worker, and the mark of those it cannot reach; see the
    module docstring."""

    def __init__(
        self, view: WorkerView, report: LoadReport, *, rng: random.Random | None = None
    ) -> None:
        self._view = view
        self._report = report
        self._rng = rng or random.Random()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._group: asyncio.TaskGroup | None = None
        self.unreachable: dict[str, str] = {}
        """Key → why, of the workers marked now (read it; for tests)."""

    def __len__(self) -> int:
        return len(self._tasks)

    async def run(self) -> None:
        """Follow the workers until cancelled; every task ends with this call."""
        async with asyncio.TaskGroup() as group:
            self._group = group
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
        found = target(record)
        if found is None or record.key in self._tasks or self._group is None:
            return
        name = f"Dynamo reach {record.instance_id}"
        self._tasks[record.key] = self._group.create_task(self._follow(record, *found), name=name)

    def _stop(self, key: str) -> None:
        task = self._tasks.pop(key, None)
        if task is not None:
            task.cancel()  # the group awaits it; _follow lifts its mark on the way out

    async def _follow(self, record: WorkerRecord, host: str, port: int, what: str) -> None:
        backoff = Backoff(FIRST, CAP, rng=self._rng)
        loop = asyncio.get_running_loop()
        try:
            while True:
                began = loop.time()
                try:
                    await self._hold(record, host, port)
                except (OSError, TimeoutError) as exc:
                    self._mark(record, f"its {what} {host}:{port} {_refusal(exc)}")
                else:
                    if loop.time() - began >= STEADY:
                        backoff.reset()
                await backoff.wait()
        finally:
            if self.unreachable.pop(record.key, None) is not None:
                self._report(record.key, None)

    async def _hold(self, record: WorkerRecord, host: str, port: int) -> None:
        """Connect (raising what refused it), then keep the connection until it ends."""
        async with asyncio.timeout(CONNECT_WITHIN):
            reader, writer = await asyncio.open_connection(host, port, limit=1)
        try:
            self._reached(record)
            _keep_alive(writer.get_extra_info("socket"))
            with contextlib.suppress(OSError):  # reset by the peer: it ended
                await reader.read(1)
        finally:
            writer.close()
            with contextlib.suppress(OSError, TimeoutError):
                async with asyncio.timeout(CONNECT_WITHIN):
                    await writer.wait_closed()

    def _mark(self, record: WorkerRecord, why: str) -> None:
        if self.unreachable.get(record.key) == why:
            return
        if record.key not in self.unreachable:
            log.warning("Dynamo worker %s is unreachable: %s", record.instance_id, why)
        self.unreachable[record.key] = why
        self._report(record.key, EngineLoad(healthy=False, reason=why, source=REACH))

    def _reached(self, record: WorkerRecord) -> None:
        if self.unreachable.pop(record.key, None) is not None:
            log.info("Dynamo worker %s is reachable again", record.instance_id)
            self._report(record.key, None)


def target(record: WorkerRecord) -> tuple[str, int, str] | None:
    """Where to reach a Dynamo worker: (host, port, what it is), or None for a record that
    is not a Dynamo worker's or names no TCP address."""
    if "card_key" not in record.extra.get("dynamo", {}):
        return None
    for url, what in ((record.system_address, "taint route's port"),
                      (record.address, "request plane")):  # fmt: skip
        try:
            parts = urlsplit(url)
            port = parts.port or DEFAULT_PORTS.get(parts.scheme)
        except ValueError:
            continue
        if parts.scheme in ("http", "https", "tcp") and parts.hostname and port:
            return parts.hostname, port, what
    return None


def _keep_alive(sock: socket.socket | None) -> None:
    if sock is None:
        return
    with contextlib.suppress(OSError, AttributeError):  # AttributeError: no TCP_KEEP* here
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        idle, interval, count = KEEPALIVE
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)


def _refusal(error: OSError | TimeoutError) -> str:
    if isinstance(error, TimeoutError) or not isinstance(error, OSError):
        return f"accepted no connection within {CONNECT_WITHIN:g} s"
    if isinstance(error, ConnectionRefusedError):
        return "refuses connection"
    return f"cannot be reached ({error.strerror or error})"
