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
LoRA cards below the card              ``model_card.dynamo.loras`` (their names): listed
                                       with the base worker, never written; workers that
                                       serve other adapters are not alike (mdcsum)
=====================================  =====================================================
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from dynamod import jsoncodec
from dynamod.errors import InvalidInputError
from dynamod.records import ModelCard, RuntimeConfig, WorkerRecord
from dynamod.store.base import Entry
from dynamod.store.dynamo.addresses import SystemAddresses
from dynamod.store.dynamo.keys import WorkerRef
from dynamod.taints import normalize

Json = dict[str, Any]
RecordKind = Literal["card", "instance"]
ENGINE = "dynamo"
"""``model_card.engine`` of every Dynamo worker."""
MAX_RECORD_BYTES = 4 * 1024 * 1024
"""A record larger than this is not read (a captured card is ~2 KB; etcd takes 1.5 MiB)."""
MODEL_FIELDS = ("slug", "model_type", "model_input", "worker_type")
"""What of the card describes the model (workers serving it alike share an mdcsum)."""


class NotUnderstood(Exception):
    """A Dynamo record this reader does not understand (see the module docstring)."""

    def __init__(self, key: str, kind: RecordKind, reason: str) -> None:
        super().__init__(f"Dynamo {kind} {key!r} is not understood: {reason}")
        self.key = key
        self.kind = kind
        self.reason = reason


@dataclass(frozen=True)
class Parts:
    """What Dynamo holds of one worker: its card, its endpoint record, its LoRA cards."""

    card: Entry
    instance: Entry
    loras: tuple[Entry, ...] = ()

    @property
    def revision(self) -> int:
        """The revision of the newest part."""
        return max(e.revision for e in (self.card, self.instance, *self.loras))


def worker_record(
    ref: WorkerRef, parts: Parts, addresses: SystemAddresses, loras: tuple[str, ...] = ()
) -> WorkerRecord:
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
        model_card=_model_card(model, runtime, loras),
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


def _model_card(model: _Fields, runtime: _Fields, loras: tuple[str, ...]) -> ModelCard:
    defaults = ModelCard(name="")
    described = {k: model.obj[k] for k in MODEL_FIELDS if k in model.obj}
    return ModelCard(
        name=_name(model),
        engine=ENGINE,
        kv_block_size=model.need("kv_cache_block_size", int),
        context_length=_context(model),
        max_num_batched_tokens=runtime.get("max_num_batched_tokens", int)
        or defaults.max_num_batched_tokens,
        max_num_seqs=runtime.get("max_num_seqs", int) or defaults.max_num_seqs,
        total_kv_blocks=runtime.get("total_kv_blocks", int) or defaults.total_kv_blocks,
        extra={"dynamo": {**described, "loras": list(loras)}},
    )


def _object(entry: Entry, kind: RecordKind) -> Json:
    if len(entry.value) > MAX_RECORD_BYTES:
        raise NotUnderstood(entry.key, kind, f"over {MAX_RECORD_BYTES} bytes long")
    try:
        obj = jsoncodec.read(entry.value, "the record")
    except InvalidInputError as exc:
        raise NotUnderstood(entry.key, kind, str(exc)) from None
    if not isinstance(obj, dict):
        raise NotUnderstood(entry.key, kind, f"a JSON {type(obj).__name__}, not an object")
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
    context: int = model.get("context_length", int) or 0
    if context <= 0:
        context = model.get("architectural_max_context_length", int) or 0
    return context if context > 0 else ModelCard(name="").context_length


def _runtime(runtime: _Fields) -> RuntimeConfig:
    weight = runtime.get("kv_transfer_preferred_weight", (int, float))
    return RuntimeConfig(
        taints=normalize(runtime.strings("taints")),
        topology_domains=runtime.string_map("topology_domains"),
        kv_transfer_domain=runtime.get("kv_transfer_domain", str),
        kv_transfer_enforcement=runtime.get("kv_transfer_enforcement", str),
        kv_transfer_preferred_weight=None if weight is None else float(weight),
    )


def _transport(instance: Entry) -> tuple[Mapping[str, str], str, str]:
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
