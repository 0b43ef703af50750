"""Listings on the wire: which worker fields a listing may ask for, and each worker's
encoded form, kept between listings.

Encoding a worker (``record_json``, ``model_card_json``, ``mdcsum``: JSON and a hash, then
protobuf) is nearly all a large listing costs, and a record changes far less often than it
is listed. So ``WorkerMessages`` keeps each worker's encoded ``Worker`` message per field
set while its record is the one the view holds (the same object at the same revision), and
writes a whole ``ListWorkersResponse`` by joining them: 10,000 workers are one
``bytes.join``, not 10,000 messages built, copied and serialized. The service hands those
bytes to gRPC as they are (``service.add_services`` registers the listing methods with a
serializer that passes bytes through); a client decodes them as any other response.

The protobuf wire format makes this exact: a message is its fields' encodings in any order,
and a repeated message field is each element as a tag, a length and the element's bytes.
Only the load and the engine's report change between listings; a worker carrying one
gets that field appended to its cached bytes. The engine's report is itself kept encoded
while it is the same object (a worker reports a new one only when its engine changes;
encoding 10,000 of them was 0.2 s of each listing of a streaming fleet). Its ``state`` is
cached as the record alone gives it (idle, no report); when the load, the report or its
model's other workers (an ``excluded`` worker, with its ``state_reason``) make it another,
that state is appended too: a parser keeps the last value of a field that comes twice
(protobuf's rule for singular fields), so the later one is the state read. Memory: about
0.8 KB per worker for every field, less for a table's few (kept per field set, at most
``FIELD_SETS`` of them), and some 150 bytes for its engine report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from dynamod.api import convert
from dynamod.api.v1 import dynamo_pb2 as pb
from dynamod.engine_events import EngineLoad
from dynamod.errors import InvalidInputError
from dynamod.records import WorkerRecord
from dynamod.results import WorkerInfo

WORKER_FIELDS = frozenset(pb.Worker.DESCRIPTOR.fields_by_name)
"""The names a listing's ``fields`` may use."""

# Field sets whose workers ``WorkerMessages`` keeps; clients use a handful (a table, JSON,
# completion), so past this many the memory starts over rather than grow.
FIELD_SETS = 8

# Field numbers, from the proto: ListWorkersResponse.workers, .revision, .id_prefix, and
# Worker.load. A tag is (number << 3) | wire type (0 varint, 2 length-delimited).
_WORKERS = pb.ListWorkersResponse.DESCRIPTOR.fields_by_name["workers"].number
_REVISION = pb.ListWorkersResponse.DESCRIPTOR.fields_by_name["revision"].number
_ID_PREFIX = pb.ListWorkersResponse.DESCRIPTOR.fields_by_name["id_prefix"].number
_LOAD = pb.Worker.DESCRIPTOR.fields_by_name["load"].number
_ENGINE = pb.Worker.DESCRIPTOR.fields_by_name["engine"].number
_STATE = pb.Worker.DESCRIPTOR.fields_by_name["state"].number
_STATE_REASON = pb.Worker.DESCRIPTOR.fields_by_name["state_reason"].number


DEFAULT_FIELDS = WORKER_FIELDS - {"model_card_json"}
"""A listing that names no fields: every field but ``model_card_json``, which
``record_json`` already holds (a client that asks for fewer fields asks for it by name)."""


def worker_fields(names: Iterable[str]) -> frozenset[str]:
    """The Worker fields a listing asks for (``DEFAULT_FIELDS`` when none is named). An
    unknown name is refused with the names that exist."""
    chosen = frozenset(names)
    unknown = sorted(chosen - WORKER_FIELDS)
    if unknown:
        raise InvalidInputError(
            f"fields names {unknown[0]!r}, which is not a worker field; the fields are "
            f"{', '.join(sorted(WORKER_FIELDS))}"
        )
    return chosen or DEFAULT_FIELDS


def varint(value: int) -> bytes:
    """A non-negative integer as a protobuf varint."""
    if value < 0:
        raise ValueError(f"a varint here is never negative, got {value}")
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def length_delimited(number: int, payload: bytes) -> bytes:
    """Field ``number`` holding ``payload`` (a message, here)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


_Entry = tuple[WorkerRecord, int, bytes, bytes]
"""(record, revision, the worker's message without load, that message as a list element)."""


class WorkerMessages:
    """Encoded listings, each worker encoded once per record and field set (module
    docstring). ``current`` (the view's ``get``) lets entries of workers that left go
    once they outnumber the workers listed."""

    def __init__(self, current: Callable[[str], WorkerRecord | None]) -> None:
        self._current = current
        self._kept: dict[frozenset[str], dict[str, _Entry]] = {}
        self._engines: dict[str, tuple[EngineLoad, bytes]] = {}
        """Each worker's engine report, and its ``engine`` field encoded."""

    def response(
        self, infos: Sequence[WorkerInfo], fields: frozenset[str], revision: int, id_prefix: int
    ) -> bytes:
        """The encoded ``ListWorkersResponse`` of ``infos`` with ``fields``."""
        kept = self._entries(fields)
        loads, engines, states = "load" in fields, "engine" in fields, "state" in fields
        parts = []
        for info in infos:
            record = info.record
            entry = kept.get(record.key)
            if entry is None or entry[0] is not record or entry[1] != info.revision:
                entry = kept[record.key] = _encode(record, info.revision, fields)
            extra = b""
            if loads and not info.load.idle:
                load = convert.load_to_pb(info.load).SerializeToString()
                extra += length_delimited(_LOAD, load)
            if engines and info.engine is not None:
                extra += self._engine_field(record.key, info.engine)
            if states and (info.engine is not None or not info.load.idle or info.state_reason):
                extra += _state_field(info)
            if info.state_reason and "state_reason" in fields:
                extra += length_delimited(_STATE_REASON, info.state_reason.encode())
            parts.append(length_delimited(_WORKERS, entry[2] + extra) if extra else entry[3])
        if len(kept) > 2 * len(infos) + 64:
            self._prune(kept)
        if len(self._engines) > 2 * len(infos) + 64:
            self._prune(self._engines)
        parts.append(varint(_REVISION << 3) + varint(revision))
        parts.append(varint(_ID_PREFIX << 3) + varint(id_prefix))
        return b"".join(parts)

    def _entries(self, fields: frozenset[str]) -> dict[str, _Entry]:
        kept = self._kept.get(fields)
        if kept is None:
            if len(self._kept) >= FIELD_SETS:
                self._kept.clear()
            kept = self._kept[fields] = {}
        return kept

    def _engine_field(self, key: str, engine: EngineLoad) -> bytes:
        kept = self._engines.get(key)
        if kept is None or kept[0] is not engine:
            field = length_delimited(_ENGINE, convert.engine_to_pb(engine).SerializeToString())
            kept = self._engines[key] = (engine, field)
        return kept[1]

    def _prune(self, kept: dict[str, _Entry] | dict[str, tuple[EngineLoad, bytes]]) -> None:
        """Let go of the entries of workers that left (or whose record changed)."""
        current = self._current
        gone = [k for k, entry in kept.items() if not _still(entry[0], current(k))]
        for key in gone:
            del kept[key]


def _still(kept: WorkerRecord | EngineLoad, current: WorkerRecord | None) -> bool:
    """Whether an entry kept for a worker still serves: its record is the view's, or (an
    engine report) the worker is still in the view."""
    return current is kept if isinstance(kept, WorkerRecord) else current is not None


def _state_field(info: WorkerInfo) -> bytes:
    """The worker's state as a field to append to its cached message (which holds the
    state of its record alone; the last value wins)."""
    return length_delimited(_STATE, str(info.state).encode())


def _encode(record: WorkerRecord, revision: int, fields: frozenset[str]) -> _Entry:
    body = convert.worker_message(record, revision, fields).SerializeToString()
    return record, revision, body, length_delimited(_WORKERS, body)


def encoded(message: pb.ListWorkersResponse | bytes) -> bytes:
    """A listing's response as gRPC sends it: already encoded, or encoded now."""
    return message if isinstance(message, bytes) else message.SerializeToString()
