"""What one worker may cost the daemon: the budgets every read from it is held to.

``Budgets`` names them, per worker:

* ``line``: bytes in one line of its engine events stream (``engine_events.MAX_LINE``, the
  wire format's own; a worker cuts its batches well under it);
* ``events_per_second`` / ``events_burst``: lines, and ``bytes_per_second`` /
  ``bytes_burst``: bytes, each a token bucket (``RateBudget``) that lives as long as the
  daemon follows the worker, across its reconnections: a new connection does not refill
  what the last one spent, so breaking and reconnecting buys a worker nothing;
* ``kv_events_per_second`` / ``kv_events_burst``: KV cache events (each stored, removed or
  cleared event of a ``kv`` line), a third bucket: a line of 64 KiB can carry 1,800
  single-block events, each an update of the router's KV index, so lines and bytes alone
  let a worker stall the loop within budget;
* ``stall``: seconds the daemon waits for a connection to open and for each line
  (a worker's heartbeats keep an idle stream within it);
* ``progress``: seconds a connection must stay up past its snapshot, within every budget,
  to count as *real progress*: only then does the daemon reset its back-off for that
  worker and lift a mark (``boundary/breaches.py``), never merely on a snapshot.

The defaults leave an honest worker far inside them: a worker sends at most 100 states a
second (``worker/publish.py``) and a heartbeat every 2 s, and an engine's KV events are a
few hundred KB a second at a busy engine's prefill rate (a few thousand events: an event
names every block of one prompt's chunk); the bursts take a reconnecting worker's whole
KV snapshot (64 MiB: some 500,000 blocks of 16 tokens; ``engine_streams.worker_budgets``
raises both bursts to what the KV index keeps for the worker).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

from dynamod.engine_events import HEARTBEAT, MAX_LINE
from dynamod.errors import InvalidInputError, UpstreamError

EVENTS_PER_SECOND = 1000.0
EVENTS_BURST = 10_000
BYTES_PER_SECOND = 2.0 * (1 << 20)
BYTES_BURST = 64 << 20
KV_EVENTS_PER_SECOND = 10_000.0
KV_EVENTS_BURST = 100_000
STALL = 3 * HEARTBEAT
PROGRESS = 5.0


class TooFastError(UpstreamError):
    """A worker sent more lines, bytes or KV events than its rate budget allows."""


@dataclass(frozen=True)
class Budgets:
    """One worker's budgets; see the module docstring. ``InvalidInputError`` names a bad one."""

    line: int = MAX_LINE
    events_per_second: float = EVENTS_PER_SECOND
    events_burst: int = EVENTS_BURST
    bytes_per_second: float = BYTES_PER_SECOND
    bytes_burst: int = BYTES_BURST
    kv_events_per_second: float = KV_EVENTS_PER_SECOND
    kv_events_burst: int = KV_EVENTS_BURST
    stall: float = STALL
    progress: float = PROGRESS

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not math.isfinite(value) or value <= 0:
                raise InvalidInputError(f"budget {f.name} must be a number above 0, got {value!r}")
        if self.bytes_burst < self.line:
            raise InvalidInputError(
                f"budget bytes_burst ({self.bytes_burst}) must hold at least one line "
                f"({self.line} bytes)"
            )


class _Bucket:
    """A token bucket: ``rate`` a second, at most ``burst`` saved; starts full."""

    __slots__ = ("burst", "level", "rate", "then")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst = rate, burst
        self.level, self.then = burst, now

    def take(self, amount: float, now: float) -> bool:
        self.level = min(self.burst, self.level + (now - self.then) * self.rate)
        self.then = now
        if self.level < amount:
            return False
        self.level -= amount
        return True


class RateBudget:
    """One worker's rate budget: lines, bytes and KV events, each a token bucket
    (``Budgets``).

    ``spend(size)`` pays for one line of ``size`` bytes, or raises ``TooFastError`` when
    the worker has spent its burst faster than its rate refills it. ``clock``: seconds,
    monotonic (tests pass their own).
    """

    def __init__(self, budgets: Budgets, clock: Callable[[], float] = time.monotonic) -> None:
        now = clock()
        self._budgets = budgets
        self._clock = clock
        self._lines = _Bucket(budgets.events_per_second, budgets.events_burst, now)
        self._bytes = _Bucket(budgets.bytes_per_second, budgets.bytes_burst, now)
        self._kv = _Bucket(budgets.kv_events_per_second, budgets.kv_events_burst, now)

    def spend(self, size: int) -> None:
        now, budgets = self._clock(), self._budgets
        if not self._lines.take(1, now):
            raise TooFastError(
                f"it sent more than {budgets.events_burst} events at once, or more than "
                f"{budgets.events_per_second:g} a second for long"
            )
        if not self._bytes.take(size, now):
            raise TooFastError(
                f"it sent more than {budgets.bytes_burst} bytes at once, or more than "
                f"{budgets.bytes_per_second:.0f} a second for long"
            )

    def spend_kv(self, count: int) -> None:
        """Pay for ``count`` KV events of one line; ``TooFastError`` past the budget."""
        if not self._kv.take(count, self._clock()):
            budgets = self._budgets
            raise TooFastError(
                f"it sent more than {budgets.kv_events_burst} KV events at once, or more "
                f"than {budgets.kv_events_per_second:g} a second for long"
            )
