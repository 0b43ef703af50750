"""The worker view's fast path for taint-only changes (``discovery/translate.py``) yields
exactly what the full path yields: the same events, records, refusals and log lines, for
random records and random changes of their stored JSON (a taint change, an out-of-band
change however small, a change of type only, another shape, bytes that are no record)."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dynamod import jsoncodec
from dynamod.discovery.translate import EventTranslator
from dynamod.discovery_events import WorkerModified
from dynamod.records import WorkerRecord
from dynamod.store import Delete, Entry, Put, Resync, WatchEvent
from tests.support.factories import make_record

KEY_ORDERS = ("canonical", "as built", "reversed")

taint = st.one_of(
    st.sampled_from(
        ["pool=fast", "pool=slow", "dynamo.io/cordoned", "dynamo.topology/zone=a", "", " x"]
    ),
    st.text(alphabet="abz=/.-_ ", max_size=6),
)
json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=3),
    st.sampled_from([1.0, 0.0, -0.0, 0.5, 2**70, 16, 16.0]),
    st.text(alphabet="ab1", max_size=3),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("ab"), inner, max_size=2)
    ),
    max_leaves=6,
)
FIELDS = (
    ("pid",),
    ("started_at",),
    ("address",),
    ("host",),
    ("x_extra",),
    ("model_card", "name"),
    ("model_card", "kv_block_size"),
    ("model_card", "x_extra"),
    ("runtime_config",),
    ("runtime_config", "topology_domains"),
    ("runtime_config", "topology_domains", "zone"),
    ("runtime_config", "kv_transfer_domain"),
    ("runtime_config", "x_extra"),
)


def _deep(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


change = st.one_of(
    st.tuples(st.just("taints"), st.lists(taint, max_size=4)),
    st.tuples(st.just("taints"), st.lists(st.one_of(taint, json_value), max_size=3)),
    st.tuples(st.just("taints"), json_value),
    st.tuples(st.just("set"), st.sampled_from(FIELDS), json_value),
    st.tuples(st.just("same"), st.sampled_from(FIELDS)),  # a value of another type, if any
    st.tuples(st.just("drop"), st.sampled_from(FIELDS)),
    st.tuples(st.just("deep"), st.sampled_from([60, 64, 65, 300])),
    st.tuples(st.just("bytes"), st.sampled_from([b"", b"{", b"[]", b"null", b'"x"', b"\xff"])),
    st.just(("delete",)),
    st.just(("resync",)),
)


@st.composite
def records(draw: st.DrawFn) -> WorkerRecord:
    zoned = draw(st.booleans())
    return make_record(
        model=draw(st.sampled_from(["pools", "tiny"])),
        taints=draw(st.lists(st.sampled_from(["pool=fast", "pool=slow", "a"]), max_size=2)),
        topology={"zone": draw(st.sampled_from(["a", "b"]))} if zoned else None,
    )


def _same_value_other_type(value: object) -> object:
    """An equal value of another JSON type (``1`` -> ``1.0``, ``1`` -> ``true``), or the
    value itself."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return float(value) if value not in (0, 1) else bool(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _edit(obj: dict[str, Any], step: tuple[Any, ...]) -> dict[str, Any] | object:
    """The stored JSON after one change (not always an object)."""
    kind = step[0]
    obj = copy.deepcopy(obj)
    if kind == "taints":
        config = obj.get("runtime_config")
        if isinstance(config, dict):
            config["taints"] = step[1]
        return obj
    if kind == "deep":
        obj["x_extra"] = _deep(step[1])
        return obj
    *parents, name = step[1]
    where: Any = obj
    for parent in parents:
        where = where.get(parent) if isinstance(where, dict) else None
    if not isinstance(where, dict):
        return obj
    if kind == "set":
        where[name] = step[2]
    elif kind == "same" and name in where:
        where[name] = _same_value_other_type(where[name])
    elif kind == "drop":
        where.pop(name, None)
    return obj


def _order(value: object, order: str) -> object:
    if isinstance(value, dict):
        items = [(k, _order(v, order)) for k, v in value.items()]
        return dict(reversed(items) if order == "reversed" else items)
    if isinstance(value, list):
        return [_order(v, order) for v in value]
    return value


def _bytes(obj: object, order: str) -> bytes:
    if order == "canonical":
        return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return json.dumps(_order(obj, order)).encode()


def _events(record: WorkerRecord, steps: list[tuple[Any, ...]], order: str) -> list[WatchEvent]:
    """The store events of ``record``'s registration, then of each change in turn."""
    key, obj = record.key, record.to_json()
    value = record.to_bytes()
    events: list[WatchEvent] = [Put(Entry(key, value, 2))]
    present = True
    for revision, step in enumerate(steps, start=3):
        if step[0] == "delete":
            events.append(Delete(key, revision))
            present = False
        elif step[0] == "resync":
            entries = (Entry(key, value, revision),) if present else ()
            events.append(Resync(entries, revision))
        else:
            if step[0] == "bytes":
                value = step[1]
            else:
                edited = _edit(obj, step)
                value = _bytes(edited, order)
                if isinstance(edited, dict):
                    obj = edited
            events.append(Put(Entry(key, value, revision)))
            present = True
    return events


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def _run(events: list[WatchEvent], *, fast: bool) -> Iterator[object]:
    """Everything observable of a translator fed ``events``: each event's discovery
    events (with their records' exact JSON), then the known records, revisions, refusals
    and log lines."""
    translator = EventTranslator(fast=fast)
    lines = _Lines()
    logger = logging.getLogger("dynamod.discovery.translate")
    logger.addHandler(lines)
    try:
        for event in events:
            found = translator.translate(event)
            yield found
            yield [jsoncodec.canonical(r.to_json()) for r in _records_of(found)]
    finally:
        logger.removeHandler(lines)
    yield {k: jsoncodec.canonical(r.to_json()) for k, r in translator.known.items()}
    yield translator.known, translator.revisions, translator.revision, translator.refused
    yield lines.lines


def _records_of(found: list[Any]) -> list[WorkerRecord]:
    return [r for e in found for r in (e.records if hasattr(e, "records") else (e.record,))]


@settings(max_examples=400, deadline=None)
@given(
    records(),
    st.lists(change, min_size=1, max_size=5),
    st.sampled_from(KEY_ORDERS),
)
def test_the_fast_path_yields_what_the_full_path_yields(
    record: WorkerRecord, steps: list[tuple[Any, ...]], order: str
) -> None:
    events = _events(record, steps, order)
    assert list(_run(events, fast=True)) == list(_run(events, fast=False))


def test_a_taint_only_change_takes_the_fast_path() -> None:
    record = make_record(model="pools", taints=["pool=fast"], topology={"zone": "a"})
    moved = record.with_caller_taints(["pool=slow"])
    translator = EventTranslator()
    translator.translate(Put(Entry(record.key, record.to_bytes(), 2)))
    [event] = translator.translate(Put(Entry(record.key, moved.to_bytes(), 3)))
    assert translator.fast_puts == 1
    assert event == WorkerModified(moved, ("pool=slow",), ("pool=fast",), 3)
    assert translator.known[record.key] == moved


def test_a_change_beside_the_taints_takes_the_full_path_and_is_refused() -> None:
    record = make_record(model="pools", taints=["pool=fast"])
    obj = record.with_caller_taints(["pool=slow"]).to_json()
    obj["pid"] = True  # equal to 1 for Python, but another JSON value: refused as today
    translator = EventTranslator()
    translator.translate(Put(Entry(record.key, record.to_bytes(), 2)))
    assert translator.translate(Put(Entry(record.key, jsoncodec.canonical(obj), 3))) == []
    assert (translator.fast_puts, translator.refused) == (0, 1)
    assert translator.known[record.key] == record
