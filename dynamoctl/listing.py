"""``workers ls``: the listing printed page by page as the daemon streams it.

The daemon sends a large fleet in pages, by model then id, all from one snapshot
(``AsyncClient.stream_workers``), so the first rows are on the screen long before the last
page arrives. Each format writes as it goes and ends up exactly as if printed at once:

* a table: column widths from the first page, grown by later pages if they need more (as
  ``workers ls --watch`` does); ids cut to the daemon's ``id_prefix``, unique over the
  whole listing;
* JSON: one array, written item by item, byte for byte what ``json.dumps(items,
  indent=2)`` would print (``indented``, with the C encoder for every string and number);
* YAML: one list, item by item; names: one per line.

Each format asks the daemon only for the fields it shows (``FIELDS``): a table needs a few
strings per worker, not the stored record.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING, Any

from dynamoctl import views
from dynamoctl.output import Printer
from dynamoctl.watch import Columns

if TYPE_CHECKING:
    from dynamod.reports import WorkerInfo, WorkerPage

_TABLE = ("id", "model", "address", "taints", "load", "started_at")
_OBJECT = (
    *_TABLE, "topology", "revision", "key", "namespace", "component", "endpoint",
    "system_address", "host", "pid", "version", "model_card_json",
)  # fmt: skip
FIELDS: dict[str, tuple[str, ...]] = {
    "table": _TABLE,
    "wide": (*_TABLE, "topology", "revision", "model_card_json"),
    "json": _OBJECT,
    "yaml": _OBJECT,
    "name": ("id",),
}
"""The worker fields each output format shows (the model card gives the mdcsum)."""


async def show(printer: Printer, pages: AsyncIterator[WorkerPage], filtered: bool) -> int:
    """Print every page as it comes; return how many workers were listed."""
    writer = _writer(printer)
    listed = 0
    async for page in pages:
        writer.page(page)
        listed += len(page.workers)
        printer.flush()
    writer.close(listed)
    if not listed:
        printer.note("no workers match" if filtered else "no workers are registered")
    return listed


class _Writer:
    def __init__(self, printer: Printer) -> None:
        self.printer = printer

    def page(self, page: WorkerPage) -> None:
        raise NotImplementedError

    def close(self, listed: int) -> None:
        """After the last page (``listed`` workers in all)."""


class _Table(_Writer):
    def __init__(self, printer: Printer) -> None:
        super().__init__(printer)
        headers = views.WORKER_WIDE_HEADERS if printer.wide else views.WORKER_HEADERS
        self.columns = Columns(printer, headers, event_column=-1)

    def page(self, page: WorkerPage) -> None:
        self.columns.rows(views.worker_rows(page.workers, self.printer.wide, page.id_prefix))


class _Names(_Writer):
    def page(self, page: WorkerPage) -> None:
        for info in page.workers:
            self.printer.line(info.id)


class _Json(_Writer):
    """One JSON array, item by item: ``[`` before the first, ``]`` after the last."""

    def __init__(self, printer: Printer) -> None:
        super().__init__(printer)
        self.started = False

    def page(self, page: WorkerPage) -> None:
        if not page.workers:
            return
        body = ",\n".join("  " + indented(item, "  ") for item in _objects(page.workers))
        self.printer.stdout.write((",\n" if self.started else "[\n") + body)
        self.started = True

    def close(self, listed: int) -> None:
        self.printer.stdout.write("\n]\n" if self.started else "[]\n")


class _Yaml(_Writer):
    def page(self, page: WorkerPage) -> None:
        import yaml

        for item in _objects(page.workers):
            self.printer.stdout.write(yaml.safe_dump([item], sort_keys=False))

    def close(self, listed: int) -> None:
        if not listed:
            self.printer.stdout.write("[]\n")


def _writer(printer: Printer) -> _Writer:
    kinds = {"json": _Json, "yaml": _Yaml, "name": _Names}
    return kinds.get(printer.output, _Table)(printer)


def _objects(workers: list[WorkerInfo]) -> list[dict[str, Any]]:
    sums: dict[int, str] = {}
    return [views.worker_object(w, views.card_sum(w, sums)) for w in workers]


_CONSTANTS = {None: "null", True: "true", False: "false"}


def indented(value: object, pad: str = "") -> str:
    """``json.dumps(value, indent=2)`` for a value nested ``pad`` deep, written with the C
    encoder for each string and number: json's own encoder is pure Python as soon as it
    indents. Anything but dicts, lists, strings, numbers, booleans and None is left to
    ``json.dumps`` (which refuses what it cannot encode, as the whole dump would)."""
    if isinstance(value, str):
        return encode_basestring_ascii(value)
    if value is None or value is True or value is False:
        return _CONSTANTS[value]
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return float.__repr__(value) if math.isfinite(value) else json.dumps(value)
    inner = pad + "  "
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = (f"{inner}{_key(k)}: {indented(v, inner)}" for k, v in value.items())
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list | tuple):
        if not value:
            return "[]"
        return "[\n" + ",\n".join(inner + indented(v, inner) for v in value) + "\n" + pad + "]"
    return json.dumps(value)


def _key(key: object) -> str:
    """A dict key as json writes it: strings as they are, numbers, booleans and None as
    their JSON text, in quotes; anything else refused, as json refuses it."""
    if isinstance(key, str):
        return encode_basestring_ascii(key)
    if key is None or isinstance(key, int | float):
        return encode_basestring_ascii(json.dumps(key))
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")
