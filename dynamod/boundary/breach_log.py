"""What the daemon logs about its workers' breaches: a bounded number of lines, whatever
the fleet does.

A partition of thousands of workers at once is thousands of breaches within a second or
two, then as many lifted marks when the network heals. One line each would be megabytes of
log (and a loop busy formatting them). ``BreachLog.note(kind, worker, detail)`` instead:

* logs the *first* event of a kind at once, whole (what it was, which worker, why): a
  single worker's breach reads as it always did;
* counts the rest of that kind for ``interval`` seconds (events, and distinct workers: a
  set of keys the fleet already holds), keeping the first ``IDS`` ids;
* then logs *one* summary line per kind: how many, a few ids, "see ``dynamoctl workers ls``".

So at most two lines per kind per interval, however many workers. The metrics
(``dynamod_worker_breaches_total``) count every breach; the log says what happened.

A window is closed by the next event of its kind after it ended, or by ``run()`` (the
owner's task: it waits for an open window, sleeps to its end and closes it), so a summary
is never held back waiting for traffic. ``close()`` writes whatever is open (at the end of
``run``). Event-loop thread only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

INTERVAL = 10.0
"""Seconds a kind's summary gathers events before it is logged."""
IDS = 3
"""Worker ids a summary names (the rest are counted)."""


@dataclass
class _Window:
    ends: float
    level: int
    first: str
    count: int = 0
    workers: set[str] = field(default_factory=set)
    ids: list[str] = field(default_factory=list)


class BreachLog:
    """Lines about breaches and lifted marks, at most two per kind per ``interval``; see
    the module docstring. ``logger``: where they go; ``clock``: seconds, monotonic."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval: float = INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._interval = interval
        self._clock = clock
        self._windows: dict[str, _Window] = {}
        self._opened = asyncio.Event()

    def note(self, kind: str, worker: str, line: str, level: int = logging.WARNING) -> None:
        """One event of ``kind`` for ``worker``: ``line`` is logged when it opens a window,
        else it is counted toward that window's summary."""
        now = self._clock()
        window = self._windows.get(kind)
        if window is not None and now >= window.ends:
            self._summarise(kind, window)
            window = None
        if window is None:
            self._windows[kind] = _Window(now + self._interval, level, worker)
            self._opened.set()
            self._log.log(level, "%s", line)
            return
        window.count += 1
        if worker != window.first and worker not in window.workers:
            window.workers.add(worker)
            if len(window.ids) < IDS:
                window.ids.append(worker)

    def flush(self) -> float | None:
        """Summarise every window that has ended; the end of the next one still open."""
        now, pending = self._clock(), []
        for kind, window in list(self._windows.items()):
            if now >= window.ends:
                self._summarise(kind, window)
            else:
                pending.append(window.ends)
        return min(pending, default=None)

    def close(self) -> None:
        """Summarise every window now, ended or not."""
        for kind, window in list(self._windows.items()):
            self._summarise(kind, window)

    async def run(self) -> None:
        """Close each window when it ends, until cancelled (then close the rest)."""
        try:
            while True:
                ends = self.flush()
                if ends is None:
                    await self._opened.wait()
                    self._opened.clear()
                else:  # a window's end is a deadline, not a flag polled on a timer
                    await asyncio.sleep(max(0.0, ends - self._clock()))
        finally:
            self.close()

    def _summarise(self, kind: str, window: _Window) -> None:
        del self._windows[kind]
        if window.count == 0:
            return
        others = len(window.workers)
        if others == 0:
            self._log.log(window.level, "the same worker %s %d more times in the last %g s: %s",
                          kind, window.count, self._interval, window.first)  # fmt: skip
            return
        more = others - len(window.ids)
        named = ", ".join(window.ids) + (f" and {more} more" if more > 0 else "")
        again = f" ({window.count} times in all)" if window.count > others else ""
        self._log.log(
            window.level,
            "%d more workers %s in the last %g s%s: %s (dynamoctl workers ls shows each)",
            others, kind, self._interval, again, named,
        )  # fmt: skip
