"""Dynamo's model card and endpoint record → our ``WorkerRecord``.

The reader takes exactly the fields below and ignores the rest (each Dynamo release adds
some). A record it cannot read — not JSON, another ``type``, a field missing or of another
type, an id that is not the key's — raises ``NotUnderstood`` naming the key and the field;
the caller leaves that worker out and says so once (``refusals``).

=====================================  =====================================================
Dynamo (``v1/mdc/...`` value)          worker record
=====================================  =====================================================
key's hex segment                      ``instance_id`` (and the key under ``v1/workers``)
``namespace/component/endpoint``       the same, checked against the key
``instance_id`` (a u64 JSON number)    checked against the key; kept as a decimal string in
                                       ``extra.dynamo.instance_id`` (jq and JavaScript
                                       round numbers above 2^53)
``card_json.display_name``             ``model_card.name`` (the model requests name)
``card_json.kv_cache_block_size``      ``model_card.kv_block_size``
``card_json.context_length``           ``model_card.context_length`` (0: the
                                       ``architectural_max_context_length``)
``runtime_config.total_kv_blocks``,    the same fields of ``model_card`` (null: defaults)
``max_num_seqs``,
``max_num_batched_tokens``
``runtime_config.taints``              ``runtime_config.taints``, sorted; absent (a worker
                                       that registered with none) is ``[]``. Caller and
                                       generated taints are split as Dynamo splits them:
                                       by the ``dynamo.topology/`` prefix
``runtime_config.topology_domains``,   the same
``kv_transfer_*``
the card's file URLs                   ``system_address`` (``addresses``)
``v1/instances/...`` ``transport``     ``address`` (``tcp://host:port``), ``host``
LoRA cards below the card              not in the record: the roster keeps their names
                                       (``roster``), ``workers get`` shows them
=====================================  =====================================================

Counts are checked here, by Dynamo's names, with the rule the record's reader applies
(a block size of at least 1, counts below 2^53, ...): a card that breaks one is refused
as not understood, under its own key, and counted, never handed on to be refused later.
A record over ``MAX_RECORD_BYTES`` is never read: a source hands on a ``TooLarge`` (its
key, size and revision) instead of its bytes, and it is refused as such.

Taints are Dynamo's: any string. A worker may hold one dynamod's grammar refuses (5,000
bytes, a control character) or the operator's cordon set by hand through its route,
which Dynamo's router does not honour. Such a worker is read as it is, with
``taint_warnings`` naming each of those taints and the rule (the roster logs them once
per revision, and counts them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from dynamod import jsoncodec
from dynamod.errors import InvalidInputError, TaintError
from dynamod.jsoncodec import Json
from dynamod.records import MAX_COUNT, ModelCard, RuntimeConfig, WorkerRecord
from dynamod.store.base import Entry
from dynamod.store.dynamo.addresses import SystemAddresses
from dynamod.store.dynamo.keys import WorkerRef
from dynamod.taints import OPERATOR_TAINTS, caller_taints, normalize, validate

RecordKind = Literal["card", "instance"]
ENGINE = "dynamo"
"""``model_card.engine`` of every Dynamo worker."""
MAX_RECORD_BYTES = 4 * 1024 * 1024
"""A record larger than this is not read (a captured card is ~2 KB; etcd takes 1.5 MiB)."""
MODEL_FIELDS = ("slug", "model_type", "model_input", "worker_type")
"""What of the card describes the model (workers serving it alike share an mdcsum)."""
WARNED_TAINTS = 3
"""How many of a card's odd taints ``taint_warnings`` names one by one."""


class NotUnderstood(Exception):
    """A Dynamo record this reader does not understand (see the module docstring)."""

    def __init__(self, key: str, kind: RecordKind, reason: str) -> None:
        super().__init__(f"Dynamo {kind} {key!r} is not understood: {reason}")
        self.key = key
        self.kind = kind
        self.reason = reason


@dataclass(frozen=True)
class TooLarge:
    """A record over ``MAX_RECORD_BYTES``, in place of its bytes: what a source keeps of
    one, so that a refused record holds no memory."""

    key: str
    size: int
    revision: int


Part = Entry | TooLarge


def bounded(entry: Entry) -> Part:
    """``entry``, or a ``TooLarge`` when it is over ``MAX_RECORD_BYTES``."""
    size = len(entry.value)
    return TooLarge(entry.key, size, entry.revision) if size > MAX_RECORD_BYTES else entry


@dataclass(frozen=True)
class Parts:
    """What Dynamo holds of one worker: its card and its endpoint record."""

    card: Part
    instance: Part

    @property
    def revision(self) -> int:
        """The revision of the newer part."""
        return max(self.card.revision, self.instance.revision)


def worker_record(ref: WorkerRef, parts: Parts, addresses: SystemAddresses) -> WorkerRecord:
    """The worker as our record; ``NotUnderstood`` when a part cannot be read."""
    card = _Fields(_object(parts.card, "card"), parts.card.key, "card")
    _check_identity(card, ref)
    model = _Fields(card.need("card_json", dict), parts.card.key, "card", "card_json")
    runtime = _Fields(model.get("runtime_config", dict) or {}, parts.card.key, "card",
                      "card_json.runtime_config")  # fmt: skip
    transport, address, host = _transport(parts.instance)
    return WorkerRecord(
        instance_id=ref.instance,
        namespace=ref.namespace,
        component=ref.component,
        endpoint=ref.endpoint,
        address=address,
        model_card=_model_card(model, runtime),
        runtime_config=_runtime(runtime),
        system_address=addresses.of(ref.instance, host, model.obj),
        host=host,
        extra={
            "dynamo": {
                "card_key": ref.card_key,
                "instance_id": str(ref.number),
                "transport": transport,
            }
        },
    )


def taint_warnings(record: WorkerRecord) -> list[str]:
    """What to say of the caller taints a Dynamo worker holds that dynamod would not set:
    the operator's, which Dynamo's router does not honour, and those its grammar refuses
    (at most ``WARNED_TAINTS`` named, then how many more)."""
    said: list[str] = []
    odd = 0
    for taint in caller_taints(record.taints):
        if taint in OPERATOR_TAINTS:
            said.append(
                f"holds {taint!r}, which NVIDIA Dynamo's router does not honour: requests "
                "that require no taint still go to it (dynamoctl workers uncordon removes it)"
            )
            continue
        try:
            validate(taint)
        except TaintError as exc:
            odd += 1
            if odd <= WARNED_TAINTS:
                said.append(f"holds a taint dynamod would refuse: {exc}; read as Dynamo holds it")
    if odd > WARNED_TAINTS:
        said.append(f"holds {odd - WARNED_TAINTS} more taints dynamod would refuse")
    return said


def _model_card(model: _Fields, runtime: _Fields) -> ModelCard:
    defaults = ModelCard(name="")
    described = {k: model.obj[k] for k in MODEL_FIELDS if k in model.obj}
    return ModelCard(
        name=_name(model),
        engine=ENGINE,
        kv_block_size=model.count("kv_cache_block_size", 1, None),
        context_length=_context(model),
        max_num_batched_tokens=runtime.count("max_num_batched_tokens", 0, 0)
        or defaults.max_num_batched_tokens,
        max_num_seqs=runtime.count("max_num_seqs", 0, 0) or defaults.max_num_seqs,
        total_kv_blocks=runtime.count("total_kv_blocks", 0, 0) or defaults.total_kv_blocks,
        extra={"dynamo": described},
    )


def _object(part: Part, kind: RecordKind) -> Json:
    if isinstance(part, Entry):
        part = bounded(part)
    if isinstance(part, TooLarge):
        raise NotUnderstood(
            part.key, kind, f"{part.size} bytes long, over {MAX_RECORD_BYTES} bytes; not read"
        )
    try:
        obj = jsoncodec.read(part.value, "the record")
    except InvalidInputError as exc:
        raise NotUnderstood(part.key, kind, str(exc)) from None
    if not isinstance(obj, dict):
        raise NotUnderstood(part.key, kind, f"a JSON {type(obj).__name__}, not an object")
    return obj


class _Fields:
    """Typed fields of one JSON object of a Dynamo record, refused by name."""

    def __init__(self, obj: Json, key: str, kind: RecordKind, where: str = "") -> None:
        self.obj, self.key, self.kind, self.where = obj, key, kind, where

    def get(self, name: str, kind: type | tuple[type, ...]) -> Any:
        value = self.obj.get(name)
        # JSON true/false are not numbers, although Python's bool subclasses int.
        if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
            return value
        shown = json.dumps(value)[:80]
        raise self.refuse(f"{self._path(name)} is {shown}, not {_kind_name(kind)}")

    def need(self, name: str, kind: type) -> Any:
        value = self.get(name, kind)
        if value is None:
            raise self.refuse(f"{self._path(name)} is missing")
        return value

    def count(self, name: str, low: int, default: int | None) -> int:
        """An integer field from ``low`` to ``MAX_COUNT``; absent (null): ``default``
        (None: it is required). The rule a worker record's reader applies, by Dynamo's
        name for the field."""
        value: int | None = self.get(name, int)
        if value is None:
            if default is None:
                raise self.refuse(f"{self._path(name)} is missing")
            return default
        if not low <= value <= MAX_COUNT:
            raise self.refuse(
                f"{self._path(name)} is {value}; it must be an integer from {low} to {MAX_COUNT}"
            )
        return value

    def strings(self, name: str) -> tuple[str, ...]:
        items: list[object] = self.get(name, list) or []
        if not all(isinstance(i, str) for i in items):
            raise self.refuse(f"{self._path(name)} holds something other than strings")
        return tuple(str(i) for i in items)

    def string_map(self, name: str) -> dict[str, str]:
        items: dict[object, object] = self.get(name, dict) or {}
        if not all(isinstance(v, str) for v in items.values()):
            raise self.refuse(f"{self._path(name)} has a value other than a string")
        return {str(k): str(v) for k, v in items.items()}

    def refuse(self, reason: str) -> NotUnderstood:
        return NotUnderstood(self.key, self.kind, reason)

    def _path(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {dict: "an object", list: "an array", str: "a string", int: "an integer"}
    return names.get(kind, "a number") if isinstance(kind, type) else "a number"


def _check_identity(card: _Fields, ref: WorkerRef) -> None:
    kind = card.obj.get("type")
    if kind != "Model":
        raise card.refuse(
            f'"type" is {json.dumps(kind)}, not "Model": a record of another kind, or of a '
            "Dynamo version this reader does not know (it reads Dynamo 1.6.1's)"
        )
    for name in ("namespace", "component", "endpoint"):
        value = card.need(name, str)
        if value != getattr(ref, name):
            raise card.refuse(f"{name} is {value!r} but the key says {getattr(ref, name)!r}")
    number = card.need("instance_id", int)
    if number != ref.number:
        raise card.refuse(
            f"instance_id is {number} but the key's id {ref.instance} is {ref.number}"
        )


def _name(model: _Fields) -> str:
    name = model.get("display_name", str) or model.get("slug", str)
    if not name:
        raise model.refuse("card_json.display_name is missing (and so is its slug)")
    return str(name)


def _context(model: _Fields) -> int:
    """``context_length``; 0 (or absent): the architectural maximum; both 0: the default."""
    context = model.count("context_length", 0, 0)
    if context == 0:
        context = model.count("architectural_max_context_length", 0, 0)
    return context or ModelCard(name="").context_length


def _runtime(runtime: _Fields) -> RuntimeConfig:
    weight = runtime.get("kv_transfer_preferred_weight", (int, float))
    return RuntimeConfig(
        taints=normalize(runtime.strings("taints")),
        topology_domains=runtime.string_map("topology_domains"),
        kv_transfer_domain=runtime.get("kv_transfer_domain", str),
        kv_transfer_enforcement=runtime.get("kv_transfer_enforcement", str),
        kv_transfer_preferred_weight=None if weight is None else float(weight),
    )


def _transport(instance: Part) -> tuple[Mapping[str, str], str, str]:
    """The endpoint record's transport, as Dynamo wrote it, its address and its host."""
    fields = _Fields(_object(instance, "instance"), instance.key, "instance")
    transport = fields.need("transport", dict)
    if len(transport) != 1 or not all(isinstance(v, str) for v in transport.values()):
        raise fields.refuse(
            f"transport is {json.dumps(transport)[:80]}, not one kind with its address"
        )
    ((kind, target),) = transport.items()
    if kind != "tcp":
        return {kind: target}, f"{kind}://{target}", ""
    hostport = target.split("/", 1)[0]
    try:
        host = urlsplit(f"//{hostport}").hostname or ""
    except ValueError:
        raise fields.refuse(f"transport tcp {target[:80]!r} names no host:port") from None
    return {kind: target}, f"tcp://{hostport}", host
