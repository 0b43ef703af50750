"""The worker record and its model card, as frozen dataclasses with a JSON form.

A worker record is one JSON object in the store, at ``v1/workers/<ns>/<component>/
<endpoint>/<instance_id>``. After registration only ``runtime_config.taints`` may change.

JSON compatibility, decided once for every level (record, card, runtime config):

* a missing optional field takes its default, so records written by older versions parse;
* an unknown field is **kept** (in ``extra``) and written back unchanged. A taint update
  rewrites the whole record by compare-and-swap; dropping fields a newer writer added would
  silently change an immutable part of its record;
* a field of the wrong type is refused with ``InvalidInputError`` naming the field, and so
  is a model card's count out of its range (``ModelCard.from_json``: a block size, a
  context, batch limits of at least 1, a KV block count of at least 0, none past
  ``MAX_COUNT``): every reader (the daemon's view, a worker following its own record)
  refuses such a record, and a worker never registers one (``discovery.registration``
  checks that its record reads back as written).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from dynamod import jsoncodec
from dynamod.errors import ImmutableFieldError, InvalidInputError, TaintError, TopologyError
from dynamod.jsoncodec import Json
from dynamod.taints import (
    TaintLimits,
    TaintUpdate,
    caller_taints,
    is_topology,
    topology_taint,
    topology_taints,
    validate,
    validate_caller_taints,
    with_topology,
)

WORKERS_PREFIX = "v1/workers"
MAX_COUNT = 2**53
"""The largest count a model card may hold: every JSON reader keeps it exact."""


def worker_key(namespace: str, component: str, endpoint: str, instance_id: str) -> str:
    return f"{WORKERS_PREFIX}/{namespace}/{component}/{endpoint}/{instance_id}"


class _Reader:
    """Takes typed fields out of one JSON object, remembering which keys were read."""

    def __init__(self, obj: object, where: str) -> None:
        if not isinstance(obj, dict):
            raise InvalidInputError(f"{where} must be a JSON object, got {type(obj).__name__}")
        self.obj: Json = obj
        self.where = where
        self.seen: set[str] = set()

    def get(self, name: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        self.seen.add(name)
        value = self.obj.get(name)
        if value is None:
            return default
        # JSON true/false are not numbers, although Python's bool subclasses int.
        if isinstance(value, bool) or not isinstance(value, kind):
            kinds = kind if isinstance(kind, tuple) else (kind,)
            names = " or ".join(k.__name__ for k in kinds)
            raise InvalidInputError(f"{self.where}.{name} must be {names}, got {value!r}")
        return value

    def count(self, name: str, default: int, low: int) -> int:
        """An integer field from ``low`` to ``MAX_COUNT`` (``default`` when absent)."""
        value: int = self.get(name, int, default)
        if not low <= value <= MAX_COUNT:
            raise InvalidInputError(
                f"{self.where}.{name} must be an integer from {low} to {MAX_COUNT}, got {value!r}"
            )
        return value

    def need(self, name: str, kind: type) -> Any:
        if name not in self.obj:
            raise InvalidInputError(f"{self.where}.{name} is required")
        return self.get(name, kind)

    def strings(self, name: str) -> tuple[str, ...]:
        items: list[object] = self.get(name, list, [])
        strings = tuple(i for i in items if isinstance(i, str))
        if len(strings) != len(items):
            raise InvalidInputError(f"{self.where}.{name} entries must be strings")
        return strings

    def string_map(self, name: str) -> dict[str, str]:
        items: dict[str, object] = self.get(name, dict, {})
        strings = {k: v for k, v in items.items() if isinstance(v, str)}
        if len(strings) != len(items):
            raise InvalidInputError(f"{self.where}.{name} values must be strings")
        return strings

    def extra(self) -> dict[str, Any]:
        return {k: v for k, v in self.obj.items() if k not in self.seen}


FORWARDING_ENGINES = frozenset({"openai"})
"""Engines whose worker passes a request's body on to an upstream server as it is
(``worker/proxy.py``): the upstream checks it, so neither the worker nor the front does.
Every other engine's worker serves its own inference routes, which run ``sampling`` and
whose engines refuse what ``check_fits`` refuses."""


@dataclass(frozen=True)
class ModelCard:
    """What the worker serves. Immutable; ``mdcsum`` decides which workers are alike."""

    name: str
    engine: str = "mocker"
    kv_block_size: int = 16
    context_length: int = 8192
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    total_kv_blocks: int = 16384
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> Json:
        return {
            **self.extra,
            "name": self.name,
            "engine": self.engine,
            "kv_block_size": self.kv_block_size,
            "context_length": self.context_length,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            "total_kv_blocks": self.total_kv_blocks,
        }

    @classmethod
    def from_json(cls, obj: object) -> ModelCard:
        r = _Reader(obj, "model_card")
        d = cls(name="")
        return cls(
            name=r.need("name", str),
            engine=r.get("engine", str, d.engine),
            kv_block_size=r.count("kv_block_size", d.kv_block_size, 1),
            context_length=r.count("context_length", d.context_length, 1),
            max_num_batched_tokens=r.count("max_num_batched_tokens", d.max_num_batched_tokens, 1),
            max_num_seqs=r.count("max_num_seqs", d.max_num_seqs, 1),
            total_kv_blocks=r.count("total_kv_blocks", d.total_kv_blocks, 0),
            extra=r.extra(),
        )


def mdcsum(card: ModelCard) -> str:
    """A stable hash of the model card. Taints live in the runtime config, never here."""
    import hashlib  # here: a listing that shows no mdcsum never pays for it

    return hashlib.sha256(jsoncodec.canonical(card.to_json())).hexdigest()


@dataclass(frozen=True)
class RuntimeConfig:
    """Routing metadata. Only ``taints`` is mutable; it always holds the topology taints."""

    taints: tuple[str, ...] = ()
    topology_domains: Mapping[str, str] = field(default_factory=dict)
    kv_transfer_domain: str | None = None
    kv_transfer_enforcement: str | None = None
    kv_transfer_preferred_weight: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> Json:
        out: Json = {**self.extra, "taints": list(self.taints)}
        if self.topology_domains:
            out["topology_domains"] = dict(self.topology_domains)
        optional = {
            "kv_transfer_domain": self.kv_transfer_domain,
            "kv_transfer_enforcement": self.kv_transfer_enforcement,
            "kv_transfer_preferred_weight": self.kv_transfer_preferred_weight,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        return out

    @classmethod
    def from_json(cls, obj: object) -> RuntimeConfig:
        r = _Reader({} if obj is None else obj, "runtime_config")
        weight = r.get("kv_transfer_preferred_weight", (int, float))
        return cls(
            taints=r.strings("taints"),
            topology_domains=r.string_map("topology_domains"),
            kv_transfer_domain=r.get("kv_transfer_domain", str),
            kv_transfer_enforcement=r.get("kv_transfer_enforcement", str),
            kv_transfer_preferred_weight=None if weight is None else float(weight),
            extra=r.extra(),
        )


@dataclass(frozen=True)
class WorkerRecord:
    """One worker incarnation as stored in discovery."""

    instance_id: str
    namespace: str
    component: str
    endpoint: str
    address: str
    model_card: ModelCard
    runtime_config: RuntimeConfig = field(default_factory=RuntimeConfig)
    system_address: str = ""
    started_at: float = 0.0
    host: str = ""
    pid: int = 0
    version: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def key(self) -> str:
        """The store key (computed once: the router reads it on every decision)."""
        return worker_key(self.namespace, self.component, self.endpoint, self.instance_id)

    @property
    def taints(self) -> tuple[str, ...]:
        return self.runtime_config.taints

    @property
    def model(self) -> str:
        return self.model_card.name

    def to_json(self) -> Json:
        return {
            **self.extra,
            "instance_id": self.instance_id,
            "namespace": self.namespace,
            "component": self.component,
            "endpoint": self.endpoint,
            "address": self.address,
            "system_address": self.system_address,
            "model_card": self.model_card.to_json(),
            "runtime_config": self.runtime_config.to_json(),
            "started_at": self.started_at,
            "host": self.host,
            "pid": self.pid,
            "version": self.version,
        }

    def to_bytes(self) -> bytes:
        return jsoncodec.canonical(self.to_json())

    def with_caller_taints(self, taints: Iterable[str]) -> WorkerRecord:
        """This record with its caller taints replaced by ``taints``.

        The only way a record's taints change. ``taints`` are validated (a reserved or
        invalid one raises ``TaintError`` and nothing changes); the topology taints are
        regenerated from the immutable ``topology_domains``, so no input can add, drop or
        alter them.
        """
        caller = validate_caller_taints(taints)
        config = self.runtime_config
        merged = with_topology(caller, config.topology_domains)
        return replace(self, runtime_config=replace(config, taints=merged))

    def updated(self, update: TaintUpdate, limits: TaintLimits | None = None) -> WorkerRecord:
        """This record after ``update``, computed on its current caller taints; with
        ``limits``, an update that grows the set past them raises ``TaintLimitError``."""
        before = caller_taints(self.taints)
        after = update.apply(before)
        if limits is not None:
            limits.check(before, after)
        return self.with_caller_taints(after)

    @classmethod
    def from_json(cls, obj: object) -> WorkerRecord:
        r = _Reader(obj, "worker")
        return cls(
            instance_id=r.need("instance_id", str),
            namespace=r.need("namespace", str),
            component=r.need("component", str),
            endpoint=r.need("endpoint", str),
            address=r.need("address", str),
            model_card=ModelCard.from_json(r.need("model_card", dict)),
            runtime_config=RuntimeConfig.from_json(r.get("runtime_config", dict)),
            system_address=r.get("system_address", str, ""),
            started_at=float(r.get("started_at", (int, float), 0.0)),
            host=r.get("host", str, ""),
            pid=r.get("pid", int, 0),
            version=r.get("version", str, ""),
            extra=r.extra(),
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> WorkerRecord:
        return cls.from_json(jsoncodec.read(data, "worker record"))


_Frozen = TypeVar("_Frozen", "WorkerRecord", "RuntimeConfig")

TaintCheck = Callable[[WorkerRecord, WorkerRecord], None]
"""A check of a taint change, called with the record before and after it: it raises to
refuse the change (the caller's rights over the taints changed, a pool's ownership)."""


def immutable_diff(old: WorkerRecord, new: WorkerRecord) -> None:
    """Refuse a same-id change outside ``runtime_config.taints``.

    Raises ``ImmutableFieldError`` naming the first differing field (dotted path), or the
    taints field when the reserved topology taints do not match ``topology_domains``.
    """
    path = _first_difference(_without_taints(old), _without_taints(new), "")
    if path is not None:
        raise ImmutableFieldError(path)
    check_topology_taints(new)


def check_topology_taints(record: WorkerRecord) -> None:
    """Refuse ``record`` unless its reserved topology taints are exactly those its
    ``topology_domains`` make (``ImmutableFieldError`` naming the taints field)."""
    expected = topology_taints(record.runtime_config.topology_domains)
    if tuple(t for t in record.taints if is_topology(t)) != expected:
        raise ImmutableFieldError(
            "runtime_config.taints",
            "its dynamo.topology/ taints must match runtime_config.topology_domains",
        )


def split_taints(raw: bytes) -> tuple[bytes, tuple[str, ...]] | None:
    """A stored record cut in two: everything but its ``runtime_config.taints``, as bytes
    that are equal only for strictly equal JSON (sorted keys; ``1``, ``1.0`` and ``true``
    write differently), and those taints. None when ``raw`` is not of the plain shape
    (an object whose ``runtime_config`` is an object holding a list of strings as
    ``taints``), or not read or written back by orjson (an integer past 64 bits, nesting
    past its limit): such a record takes the full reader (``from_bytes``).

    The worker view's fast path (``discovery/translate.py``): a record whose first part
    equals the one its known record was read from differs from it in its taints only."""
    obj = jsoncodec.read_unchecked(raw)
    if not isinstance(obj, dict) or not isinstance(config := obj.get("runtime_config"), dict):
        return None
    taints = config.get("taints")
    if not isinstance(taints, list) or not all(isinstance(t, str) for t in taints):
        return None
    obj["runtime_config"] = {k: v for k, v in config.items() if k != "taints"}
    fixed = jsoncodec.strict(obj)
    if fixed is None:
        return None
    return fixed, tuple(taints)


def with_taints(record: WorkerRecord, taints: tuple[str, ...]) -> WorkerRecord:
    """``record`` holding ``taints`` as they are (no check, no normalisation): what
    ``from_json`` reads from the JSON ``record`` was read from with those taints in it."""
    return _copy(record, runtime_config=_copy(record.runtime_config, taints=taints))


def _copy(value: _Frozen, **changes: Any) -> _Frozen:
    """``dataclasses.replace(value, **changes)`` at a tenth of its cost (it inspects every
    field on every call): these dataclasses keep their fields in ``__dict__`` and have no
    ``__post_init__``, so a copy of that dict is the same object (with ``key`` computed
    already: the fields it is made of are not among the changes)."""
    copy = object.__new__(type(value))
    copy.__dict__.update(value.__dict__, **changes)
    return copy


def _without_taints(record: WorkerRecord) -> Json:
    obj = record.to_json()
    obj["runtime_config"] = {k: v for k, v in obj["runtime_config"].items() if k != "taints"}
    return obj


def _first_difference(a: object, b: object, path: str) -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for name in sorted(set(a) | set(b)):
            sub = f"{path}.{name}" if path else name
            if name not in a or name not in b:
                return sub
            found = _first_difference(a[name], b[name], sub)
            if found is not None:
                return found
        return None
    return None if a == b else path


ENFORCEMENTS = ("required", "preferred")


def validate_topology(config: RuntimeConfig) -> None:
    """Check topology domains and kv-transfer settings; raise ``TopologyError`` if invalid.

    The messages are Dynamo's own, word for word."""
    for domain, value in config.topology_domains.items():
        _check_domain(domain, value)
    _check_transfer(config)


def _check_domain(domain: str, value: str) -> None:
    if not domain.strip():
        raise TopologyError("topology_domains keys must be non-empty")
    if domain != domain.strip():
        raise TopologyError(
            f'topology_domains key "{domain}" must not contain leading or trailing whitespace'
        )
    if not value.strip():
        raise TopologyError(f'topology_domains value for "{domain}" must be non-empty')
    if value != value.strip():
        raise TopologyError(
            f'topology_domains value for "{domain}" must not contain leading or trailing whitespace'
        )
    try:
        validate(topology_taint(domain, value), allow_reserved=True)
    except TaintError as exc:
        raise TopologyError(
            f'topology_domains entry "{domain}"="{value}" does not make a valid taint: {exc}'
        ) from None


def _check_transfer(config: RuntimeConfig) -> None:
    domain = config.kv_transfer_domain
    enforcement = config.kv_transfer_enforcement
    weight = config.kv_transfer_preferred_weight
    if domain is not None:
        if not domain.strip():
            raise TopologyError("kv_transfer_domain must be non-empty when set")
        if domain != domain.strip():
            raise TopologyError(
                "kv_transfer_domain must not contain leading or trailing whitespace"
            )
        if domain not in config.topology_domains:
            raise TopologyError(
                f'kv_transfer_domain "{domain}" must reference a key in topology_domains'
            )
    if enforcement is not None:
        if enforcement not in ENFORCEMENTS:
            raise TopologyError(
                f"kv_transfer_enforcement must be 'required' or 'preferred', got {enforcement!r}"
            )
        if domain is None:
            raise TopologyError("kv_transfer_enforcement requires kv_transfer_domain")
    if enforcement == "preferred" and weight is None:
        raise TopologyError(
            "kv_transfer_preferred_weight is required when kv_transfer_enforcement is preferred"
        )
    if weight is not None:
        if enforcement != "preferred":
            raise TopologyError(
                "kv_transfer_preferred_weight can only be set when kv_transfer_enforcement "
                "is preferred"
            )
        if not 0.0 <= weight <= 1.0:
            raise TopologyError(f"kv_transfer_preferred_weight must be from 0 to 1, got {weight}")
