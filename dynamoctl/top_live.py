"""The live screen of ``dynamoctl top``: frames from the daemon's stats stream redrawn as
they come (one a second), and the keys that change what is asked for.

Keys: ``q`` quits (so does Ctrl-C); ``/`` types a selector (the ``-l`` language; Enter
applies it, an empty one shows every worker, Esc leaves it as it was); space or ``p``
pauses and resumes the display; ``<`` and ``>`` sort by the previous or next column
(``l`` back to load), ``r`` reverses the order; the arrows, PgUp, PgDn, Home and End
scroll. The daemon sorts, and sends only the rows that fit the screen: a new order, a new
selector, a scroll or a resize is a new stream of the same call. When the daemon cannot
be reached the last frame stays on the screen with the reason in the status line, and the
stream is opened again every second.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING

from dynamoctl import exits, top_frames
from dynamod.errors import DynamoError, SelectorError
from dynamod.selectors import parse
from dynamod.stats_results import FleetStats, StatsQuery

if TYPE_CHECKING:
    from dynamoctl.output import Screen
    from dynamoctl.terminal import KeyReader
    from dynamod.client import AsyncClient

RETRY = 1.0
"""Seconds between two attempts to open the stream while the daemon cannot be reached."""
HEADER_LINES = 4
"""The lines ``top_frames.header_lines`` writes: the rows are fitted below them."""
HELP = "q quit  / filter  space pause  < > sort  r reverse  arrows scroll"
SCROLL = {"up": -1, "down": 1}


class LiveTop:
    """One live session; see the module docstring."""

    def __init__(self, client: AsyncClient, screen: Screen, query: StatsQuery) -> None:
        self.client = client
        self.screen = screen
        self.query = dataclasses.replace(query, limit=self._fitting())
        self.frame: FleetStats | None = None
        self.paused = False
        self.editing: str | None = None
        self.message = ""

    async def run(self, keys: KeyReader) -> int:
        """Draw until ``q`` (or until cancelled: Ctrl-C)."""
        self.draw()
        async with asyncio.TaskGroup() as group:
            follow = group.create_task(self._follow(), name="top frames")
            try:
                while (action := self.press(await keys.get())) != "quit":
                    if action == "query":
                        follow.cancel()
                        follow = group.create_task(self._follow(), name="top frames")
                    self.draw()
            finally:
                follow.cancel()
        return exits.OK

    async def _follow(self) -> None:
        """The frames of the current query, drawn as they come; reopened after a failure."""
        query = self.query
        while True:
            try:
                async for frame in self.client.watch_stats(query):
                    self.frame, self.message = frame, ""
                    if not self.paused:
                        self.draw()
                self.message = "dynamod ended the stream (it is draining); opening it again"
            except DynamoError as exc:
                self.message = f"{exc}; trying again"
            self.draw()
            await asyncio.sleep(RETRY)  # nothing to wait on: the daemon is away

    # Keys

    def press(self, key: str) -> str:
        """What ``key`` does: ``quit``, ``query`` (ask the daemon anew) or ``draw``."""
        if self.editing is not None:
            return self._edit(key)
        query = self.query
        if key == "q":
            return "quit"
        if key == "/":
            self.editing = query.selector
        elif key in (" ", "p"):
            self.paused = not self.paused
        elif key in ("<", ">", "l", "r"):
            sort = "load" if key == "l" else query.sort
            if key in "<>":
                sort = top_frames.step(query.sort, -1 if key == "<" else 1)
            reverse = not query.reverse if key == "r" else False
            return self._ask(sort=sort, reverse=reverse, offset=0)
        elif key in ("up", "down", "pgup", "pgdn", "home", "end"):
            return self._scroll(key)
        elif key == "resize":
            return self._ask(limit=self._fitting())
        return "draw"

    def _edit(self, key: str) -> str:
        typed = self.editing or ""
        if key == "escape":
            self.editing = None
        elif key == "enter":
            try:
                parse(typed)
            except SelectorError as exc:
                self.message = str(exc)
                return "draw"
            self.editing = None
            return self._ask(selector=typed.strip(), offset=0)
        elif key == "backspace":
            self.editing = typed[:-1]
        elif len(key) == 1:
            self.editing = typed + key
        return "draw"

    def _scroll(self, key: str) -> str:
        query = self.query
        matched = self.frame.matched if self.frame is not None else 0
        last = max(0, matched - query.limit)
        page = max(1, query.limit - 1)
        offsets = {
            "home": 0, "end": last, "pgup": query.offset - page, "pgdn": query.offset + page,
        }  # fmt: skip
        wanted = offsets.get(key, query.offset + SCROLL.get(key, 0))
        return self._ask(offset=min(max(0, wanted), last))

    def _ask(self, **changes: object) -> str:
        query = dataclasses.replace(self.query, **changes)  # type: ignore[arg-type]
        if query == self.query:
            return "draw"
        self.query = query
        return "query"

    def _fitting(self) -> int:
        _, height = self.screen.size
        return top_frames.fitting_rows(height, [""] * HEADER_LINES)

    # Drawing

    def draw(self) -> None:
        frame = self.frame
        lines = ["dynamod: waiting for the first frame..."]
        rows: list[list[str]] = []
        if frame is not None:
            lines = top_frames.header_lines(frame, self.query.selector)
            rows = top_frames.rows(frame)
        mark = top_frames.sorted_column(self.query.sort)
        self.screen.draw(lines, top_frames.HEADERS, rows, self._status(), mark=mark)

    def _status(self) -> str:
        if self.editing is not None:
            note = f"  ({self.message})" if self.message else ""
            return f"filter (-l): {self.editing}_   Enter apply  Esc cancel{note}"
        query, frame = self.query, self.frame
        parts = [top_frames.sorted_by(query.sort, query.reverse)]
        if frame is not None and frame.matched:
            shown = len(frame.rows)
            parts.append(f"rows {frame.offset + 1}-{frame.offset + shown} of {frame.matched}")
        if query.selector:
            parts.append(f"-l {query.selector}")
        if self.paused:
            parts.append("PAUSED")
        parts.append(self.message or HELP)
        return "  ".join(parts)
