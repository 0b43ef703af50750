"""``workers ls``: the listing printed page by page as the daemon streams it (``command``:
the whole command, ``--watch`` included, for the typer command and ``direct.py`` alike).

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

from dynamoctl import exits, formats
from dynamoctl.output import Printer

if TYPE_CHECKING:
    from dynamoctl.jsonpath import Path
    from dynamoctl.session import Body, LightBody
    from dynamod.client import AsyncClient
    from dynamod.client.light import LightClient
    from dynamod.reports import EventInfo
    from dynamod.results import WorkerInfo, WorkerPage

# LOAD shows both load and engine.
_TABLE = ("id", "model", "address", "taints", "state", "load", "engine", "started_at")
_OBJECT = (
    *_TABLE, "topology", "revision", "key", "namespace", "component", "endpoint",
    "system_address", "host", "pid", "version", "model_card_json", "state_reason",
)  # fmt: skip
FIELDS: dict[str, tuple[str, ...]] = {
    "table": _TABLE,
    "wide": (*_TABLE, "topology", "revision", "model_card_json", "state_reason"),
    "json": _OBJECT,
    "yaml": _OBJECT,
    "name": ("id",),
}
"""The worker fields each output format shows (the model card gives the mdcsum)."""
WARNINGS = 10
"""How many workers' warnings (``WorkerInfo.warning``) a listing prints after its rows."""


def command(selector: str | None, model: str | None, watch: bool, sort_by: str | None) -> Body:
    """The whole of ``workers ls`` with these flags (``sort_by`` already parses), as a
    session body: the typer command and ``direct.py`` run this one."""
    if not watch:
        return listed(selector, model, sort_by)

    async def body(client: AsyncClient, printer: Printer) -> int:
        from dynamoctl.selection import check_selector

        check_selector(selector)
        return await _watch(client, printer, _with_model(selector, model))

    return body


def listed(selector: str | None, model: str | None, sort_by: str | None) -> LightBody:
    """``workers ls`` without ``--watch``: one listing, which the light client can make."""

    async def body(client: AsyncClient | LightClient, printer: Printer) -> int:
        from dynamoctl.selection import check_selector

        check_selector(selector)
        fields = FIELDS["json" if sort_by else printer.output]
        pages: AsyncIterator[WorkerPage] = client.stream_workers(
            model=model or "", selector=selector or "", fields=fields
        )
        if sort_by:
            from dynamoctl.jsonpath import parse_path

            pages = sorted_by(parse_path(sort_by), pages)
        await show(printer, pages, filtered=bool(selector or model))
        return exits.OK

    return body


def _with_model(selector: str | None, model: str | None) -> str:
    terms = [t for t in (selector, f"model={model}" if model else None) if t]
    return ",".join(terms)


async def _watch(client: AsyncClient, printer: Printer, selector: str) -> int:
    from dynamoctl.resume import following
    from dynamoctl.watch import WorkerWatch

    if printer.output in ("table", "wide"):
        printer.id_prefix = await client.id_prefix()
    watch = WorkerWatch(printer)

    def tail(after: int | None) -> AsyncIterator[EventInfo]:
        return client.tail_events(since=after, selector=selector, follow=True)

    async for event in following(printer, tail, None):
        watch.feed(event)
    return exits.FAILED  # not reached: following() ends only with the command


async def show(printer: Printer, pages: AsyncIterator[WorkerPage], filtered: bool) -> int:
    """Print every page as it comes; return how many workers were listed."""
    writer = _writer(printer)
    listed = 0
    warnings: list[str] = []
    async for page in pages:
        writer.page(page)
        listed += len(page.workers)
        warnings += [w.warning for w in page.workers if w.warning][: WARNINGS - len(warnings)]
        printer.flush()
    writer.close(listed)
    if not listed:
        printer.note("no workers match" if filtered else "no workers are registered")
    for warning in warnings:
        printer.note(f"warning: {warning}")
    return listed


async def sorted_by(path: Path, pages: AsyncIterator[WorkerPage]) -> AsyncIterator[WorkerPage]:
    """``--sort-by``: every page, then one page of them all by the value ``path`` names
    in each worker's ``-o json`` object (kubectl's order: numbers, then strings, then
    the rest; workers without the value last; ties by model and id, as listed)."""
    from dynamoctl.jsonpath import sort_key
    from dynamod.results import WorkerPage

    workers: list[WorkerInfo] = []
    revision = prefix = 0
    async for page in pages:
        workers += page.workers
        revision, prefix = page.revision, page.id_prefix
    keys = {id(w): sort_key(path, o) for w, o in zip(workers, _objects(workers), strict=True)}
    workers.sort(key=lambda w: keys[id(w)])
    yield WorkerPage(workers, revision, prefix)


class _Writer:
    def __init__(self, printer: Printer) -> None:
        self.printer = printer

    def page(self, page: WorkerPage) -> None:
        raise NotImplementedError

    def close(self, listed: int) -> None:
        """After the last page (``listed`` workers in all)."""


class _Table(_Writer):
    def __init__(self, printer: Printer) -> None:
        from dynamoctl.watch import Columns  # with pool_formats: a table's, not JSON's

        super().__init__(printer)
        headers = formats.WORKER_WIDE_HEADERS if printer.wide else formats.WORKER_HEADERS
        self.columns = Columns(printer, headers, event_column=-1)

    def page(self, page: WorkerPage) -> None:
        self.columns.rows(formats.worker_rows(page.workers, self.printer.wide, page.id_prefix))


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
        seen: dict[tuple[int, str], str] = {}
        items = _objects(page.workers)
        body = ",\n".join(["  " + indented(item, "  ", seen) for item in items])
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


class _Shaped(_Writer):
    """``-o jsonpath=`` / ``custom-columns=``: the objects of ``-o json``, shaped at the
    end (a template sees the whole list)."""

    def __init__(self, printer: Printer) -> None:
        super().__init__(printer)
        self.items: list[dict[str, Any]] = []

    def page(self, page: WorkerPage) -> None:
        self.items += _objects(page.workers)

    def close(self, listed: int) -> None:
        self.printer.json(self.items)


def _writer(printer: Printer) -> _Writer:
    if printer.shape is not None:
        return _Shaped(printer)
    kinds = {"json": _Json, "yaml": _Yaml, "name": _Names}
    return kinds.get(printer.output, _Table)(printer)


def _objects(workers: list[WorkerInfo]) -> list[dict[str, Any]]:
    """The workers' JSON objects; those sharing a model card share its dict (and so its
    encoding, see ``indented``)."""
    sums: dict[int, str] = {}
    cards: dict[int, dict[str, Any]] = {}
    objects = []
    for info in workers:
        card = info.record.model_card
        shared = cards.get(id(card))
        if shared is None:
            shared = cards[id(card)] = card.to_json()
        objects.append(formats.worker_object(info, formats.card_sum(info, sums), shared))
    return objects


_CONSTANTS = {None: "null", True: "true", False: "false"}
# Each indentation's dict keys, written with their indent and colon: worker objects repeat
# the same few keys (bounded: keys come from the data, and a model card may carry any).
_HEADS: dict[str, dict[object, str]] = {}
_KEPT_KEYS = 4096


def indented(value: object, pad: str = "", seen: dict[tuple[int, str], str] | None = None) -> str:
    """``json.dumps(value, indent=2)`` for a value nested ``pad`` deep, written with the C
    encoder for each string and number: json's own encoder is pure Python as soon as it
    indents. Anything but dicts, lists, strings, numbers, booleans and None is left to
    ``json.dumps`` (which refuses what it cannot encode, as the whole dump would).
    ``seen`` remembers the text of each dict and list by identity: pass one for values
    that share sub-objects and do not change meanwhile (a page of worker objects)."""
    kind = type(value)
    if kind is str:
        return encode_basestring_ascii(value)  # type: ignore[arg-type]
    if kind is dict or kind is list:
        return _container(value, pad, seen)  # type: ignore[arg-type]
    if value is None or value is True or value is False:
        return _CONSTANTS[value]
    if isinstance(value, str):
        return encode_basestring_ascii(value)
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return float.__repr__(value) if math.isfinite(value) else json.dumps(value)
    if isinstance(value, dict | list | tuple):
        return _container(value, pad, seen)
    return json.dumps(value)


def _container(
    value: dict[object, object] | list[object] | tuple[object, ...],
    pad: str,
    seen: dict[tuple[int, str], str] | None,
) -> str:
    if not value:
        return "{}" if isinstance(value, dict) else "[]"
    if seen is not None:
        found = seen.get((id(value), pad))
        if found is not None:
            return found
    inner = pad + "  "
    if isinstance(value, dict):
        text = "{\n" + ",\n".join(_members(value, inner, seen)) + "\n" + pad + "}"
    else:
        text = "[\n" + ",\n".join([inner + indented(v, inner, seen) for v in value])
        text += "\n" + pad + "]"
    if seen is not None:
        seen[id(value), pad] = text
    return text


def _members(
    value: dict[object, object], inner: str, seen: dict[tuple[int, str], str] | None
) -> list[str]:
    """A dict's ``"key": value`` lines; strings and ints, most of a worker, inline."""
    heads = _HEADS.get(inner)
    if heads is None:
        heads = _HEADS[inner] = {}
    lines = []
    for key, item in value.items():
        head = heads.get(key) if type(key) is str else None
        if head is None:
            head = f"{inner}{_key(key)}: "
            if type(key) is str and len(heads) < _KEPT_KEYS:
                heads[key] = head
        kind = type(item)
        if kind is str:
            lines.append(head + encode_basestring_ascii(item))  # type: ignore[arg-type]
        elif kind is int:
            lines.append(head + int.__repr__(item))
        else:
            lines.append(head + indented(item, inner, seen))
    return lines


def _key(key: object) -> str:
    """A dict key as json writes it: strings as they are, numbers, booleans and None as
    their JSON text, in quotes; anything else refused, as json refuses it."""
    if isinstance(key, str):
        return encode_basestring_ascii(key)
    if key is None or isinstance(key, int | float):
        return encode_basestring_ascii(json.dumps(key))
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")
