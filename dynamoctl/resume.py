"""Following the daemon's events across its restarts (``events tail``, ``workers ls
--watch``): when the stream ends or dynamod cannot be reached, say so on stderr, wait
(``dynamod.backoff``), and open it again from the last revision seen; the daemon replays
what came after it, or sends a RESYNC snapshot when its history no longer reaches back
(a restarted daemon's does not), which ``--watch`` turns into only the differences. Ends
only when the command does (Ctrl-C), on an error that is not about reaching dynamod (a
refused token, a bad selector), or when dynamod was never reached at all."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from dynamod.errors import UnreachableError

if TYPE_CHECKING:
    from dynamoctl.output import Printer
    from dynamod.reports import EventInfo

Tail = Callable[[int | None], AsyncIterator["EventInfo"]]
"""Opens the event stream after a revision (None: from now, with a snapshot first)."""
FIRST_DELAY, MAX_DELAY = 0.2, 5.0


async def following(printer: Printer, tail: Tail, since: int | None) -> AsyncIterator[EventInfo]:
    """Every event of ``tail``, reopened after each end (see the module docstring)."""
    from dynamod.backoff import Backoff

    backoff = Backoff(FIRST_DELAY, MAX_DELAY)
    last, lost, up = since, False, False
    while True:
        try:
            async for event in tail(last):
                up = True
                if lost:
                    printer.note(f"reconnected to dynamod; resumed after revision {last}")
                    lost = False
                backoff.reset()  # real progress: an event came
                last = event.revision if last is None else max(last, event.revision)
                yield event
            why = "dynamod ended the stream (it is shutting down or restarting)"
        except UnreachableError as exc:
            if not up:
                raise  # never reached: the endpoint is wrong or dynamod is not running
            why = f"lost dynamod ({exc})"
        if not lost:
            where = "from now" if last is None else f"after revision {last}"
            printer.note(f"{why}; reconnecting to resume {where} (Ctrl-C ends)")
            lost = True
        await backoff.wait()
