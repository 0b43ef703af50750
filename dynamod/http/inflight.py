"""Requests in flight, for a graceful drain: used by the worker's routes and the front."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from prometheus_client import Gauge


class RequestTracker:
    """Counts requests being served and says when none is.

    ``with tracker.request():`` around each request; ``begin_drain()`` makes ``draining``
    true (callers then refuse new requests); ``wait_idle()`` returns once the count is
    zero. ``gauge``, when given, mirrors the count for Prometheus.
    """

    def __init__(self, gauge: Gauge | None = None) -> None:
        self._count = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._gauge = gauge
        self.draining = False

    def __len__(self) -> int:
        return self._count

    def begin_drain(self) -> None:
        self.draining = True

    async def wait_idle(self) -> None:
        await self._idle.wait()

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        self._count += 1
        self._idle.clear()
        if self._gauge is not None:
            self._gauge.inc()
        try:
            yield
        finally:
            self._count -= 1
            if self._gauge is not None:
                self._gauge.dec()
            if self._count == 0:
                self._idle.set()


class Drains:
    """For a server that drains on shutdown: counts its requests in ``_requests`` and says
    so. ``begin_drain()`` (new requests then get 503), ``wait_idle()``, ``in_flight``."""

    _requests: RequestTracker

    @property
    def in_flight(self) -> int:
        return len(self._requests)

    @property
    def draining(self) -> bool:
        return self._requests.draining

    def begin_drain(self) -> None:
        """Refuse new requests (503); those in flight run to their end."""
        self._requests.begin_drain()

    async def wait_idle(self) -> None:
        """Return once no request is in flight (at once if none is).

        Call ``begin_drain`` first, or new requests may start right after; bound the wait
        with ``asyncio.timeout`` for a grace period.
        """
        await self._requests.wait_idle()
