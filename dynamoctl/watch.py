"""Printing streams of discovery events as they arrive, a line (or a JSON object) per event.

``WorkerWatch`` is ``workers ls --watch``: the worker table with an EVENT column in front,
kubectl's ``get -w --output-watch-events``. The first snapshot prints every worker as
ADDED; a later snapshot (the daemon re-synced) is compared with what was shown, so only
real differences print. ``EventTail`` is ``events tail``: the events as the daemon sends
them, pool events (``POOL``) among them. Column widths come from the first lines and only
ever grow, up to ``MAX_CELL`` (a longer cell is cut, ending in ``…``; ``-o json`` has it
whole); every line is flushed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dynamoctl import formats, pool_formats
from dynamoctl.output import Printer, widths_of

if TYPE_CHECKING:
    from dynamod.reports import EventInfo
    from dynamod.results import WorkerInfo

EVENT_STYLES = {
    "ADDED": "green", "REMOVED": "red", "TAINTS": "yellow", "RESYNC": "cyan", "POOL": "magenta",
}  # fmt: skip
EVENT_WIDTH = max(len(k) for k in EVENT_STYLES)  # so the EVENT column never shifts


MAX_CELL = 60
"""The widest a column of a stream grows (``bounded``): a longer cell is cut, ending in
``…``, so that one worker with hundreds of taints does not pad every later line."""


def cut(cell: str, width: int = MAX_CELL) -> str:
    return cell if len(cell) <= width else cell[: width - 1] + "…"


class Columns:
    """A table printed a few rows at a time: widths fixed by the first rows, then grown;
    ``bounded``: no column but the last wider than ``MAX_CELL`` (streams)."""

    def __init__(
        self, printer: Printer, headers: Sequence[str], event_column: int, *, bounded: bool = False
    ) -> None:
        self.printer = printer
        self.headers = list(headers)
        self.widths: list[int] = []
        self.event_column = event_column
        self.bounded = bounded

    def rows(self, rows: Sequence[Sequence[str]]) -> None:
        if not rows:
            return
        if self.bounded:
            rows = [[*(cut(c) for c in row[:-1]), row[-1]] for row in rows]
        if not self.widths:
            minimum = [EVENT_WIDTH if i == self.event_column else 0 for i in range(len(rows[0]))]
            self.widths = self.printer.table(self.headers, rows, style=self._style, minimum=minimum)
        else:
            grown = widths_of(rows)
            self.widths = [max(w, g) for w, g in zip(self.widths, grown, strict=True)]
            for row in rows:
                self.printer.row(row, self.widths, style=self._style)
        self.printer.flush()

    def _style(self, column: int, cell: str) -> str | None:
        return EVENT_STYLES.get(cell) if column == self.event_column else None


class WorkerWatch:
    """``workers ls --watch``; see the module docstring."""

    def __init__(self, printer: Printer) -> None:
        self.printer = printer
        self.known: dict[str, WorkerInfo] = {}
        headers = formats.WORKER_WIDE_HEADERS if printer.wide else formats.WORKER_HEADERS
        self.columns = Columns(printer, ("EVENT", *headers), 0, bounded=True)

    def feed(self, event: EventInfo) -> None:
        changes = self._changes(event)
        for kind, info in changes:
            self._remember(kind, info)
        self._print(changes, event.revision)

    def _changes(self, event: EventInfo) -> list[tuple[str, WorkerInfo]]:
        if event.kind == "RESYNC":
            return self._diff(event.workers)
        assert event.worker is not None
        return [(event.kind, event.worker)]

    def _diff(self, workers: Sequence[WorkerInfo]) -> list[tuple[str, WorkerInfo]]:
        now = {w.id: w for w in workers}
        gone = [("REMOVED", w) for i, w in self.known.items() if i not in now]
        added = [("ADDED", w) for i, w in now.items() if i not in self.known]
        moved = [
            ("TAINTS", w)
            for i, w in now.items()
            if i in self.known and self.known[i].record.taints != w.record.taints
        ]
        return sorted(gone + added + moved, key=lambda c: (c[1].record.model, c[1].id))

    def _remember(self, kind: str, info: WorkerInfo) -> None:
        if kind == "REMOVED":
            self.known.pop(info.id, None)
        else:
            self.known[info.id] = info

    def _print(self, changes: list[tuple[str, WorkerInfo]], revision: int) -> None:
        if self.printer.output in ("json", "yaml"):
            for kind, info in changes:
                obj = {"event": kind, "revision": revision, "worker": formats.worker_object(info)}
                self._structured(obj)
            return
        if self.printer.output == "name":
            for kind, info in changes:
                self.printer.line(f"{kind} {info.id}")
            self.printer.flush()
            return
        ids = [*self.known, *(i.id for _, i in changes)]
        shorts = formats.short_ids(ids, self.printer.id_prefix)
        now = time.time()
        rows = [
            [kind, *formats.worker_row(info, shorts[info.id], self.printer.wide, now)]
            for kind, info in changes
        ]
        self.columns.rows(rows)

    def _structured(self, obj: object) -> None:
        if self.printer.output == "json":
            self.printer.json_line(obj)
        else:
            self.printer.yaml(obj, document=True)
            self.printer.flush()


class EventTail:
    """``events tail``; see the module docstring. ``buffered``: the stream is finite
    (``--no-follow``), so table rows wait for ``close()`` and align as one table."""

    def __init__(self, printer: Printer, *, buffered: bool = False) -> None:
        self.printer = printer
        self.buffered = buffered
        self.pending: list[list[str]] = []
        headers = formats.EVENT_WIDE_HEADERS if printer.wide else formats.EVENT_HEADERS
        self.columns = Columns(printer, headers, 2, bounded=True)
        self.seen: set[str] = set()
        self.id_length = printer.id_prefix

    def feed(self, event: EventInfo) -> None:
        self._see(event)
        if self.printer.output == "json":
            self.printer.json_line(_event_object(event))
        elif self.printer.output == "yaml":
            self.printer.yaml(_event_object(event), document=True)
            self.printer.flush()
        elif self.buffered:
            self.pending.append(_event_row(event, self.printer.wide, self.id_length))
        else:
            self.columns.rows([_event_row(event, self.printer.wide, self.id_length)])

    def _see(self, event: EventInfo) -> None:
        """Ids are cut to the daemon's prefix for the fleet when the tail began, longer
        once two ids the stream has shown would share it (workers that joined since)."""
        ids = [w.id for w in event.workers] if event.kind == "RESYNC" else []
        if event.worker is not None:
            ids.append(event.worker.id)
        if event.pool is not None and event.pool.worker:
            ids.append(event.pool.worker)
        fresh = [i for i in ids if i not in self.seen]
        if fresh:
            self.seen.update(fresh)
            self.id_length = formats.id_length(self.seen, self.id_length)

    def close(self) -> None:
        self.columns.rows(self.pending)
        self.pending = []


def _event_object(event: EventInfo) -> dict[str, Any]:
    """A discovery event's object, or a pool event's (``pool_formats``)."""
    obj = formats.event_object(event)
    if event.pool is not None:
        obj["pool"] = pool_formats.pool_event_object(event.pool)
    return obj


def _event_row(event: EventInfo, wide: bool, id_length: int) -> list[str]:
    if event.pool is not None:
        return pool_formats.pool_event_row(event, wide, id_length)
    return formats.event_row(event, wide, id_length)
