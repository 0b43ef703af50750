"""The routing table: which workers exist, per model, and which of them a request may use.

Pure and synchronous: no asyncio, no I/O, no clock. One ``RoutingTable`` folds discovery
events into workers grouped by model, with an inverted index taint → worker keys per model.

* ``apply(event)`` costs O(taints of that worker); a ``ViewResync`` rebuilds everything.
* Every worker remembers the revision of the event that last wrote it, and an event older
  than that is ignored. So adds and taint updates converge to the newest record whatever
  order they arrive in; only a removal followed by an *older* add of the same worker is
  order-dependent (a removal leaves no tombstone: the key is gone, and so is its revision).
* ``TaintsUpdated`` for a worker the table does not know adds it: the event carries the
  whole record, so there is nothing to gain by dropping it.
* ``eligible(model, constraints, exclude)`` intersects the required taints' key sets,
  smallest first, then drops cordoned workers (``dynamo.io/cordoned``) unless the request
  requires that very taint, and the excluded keys. Workers come back in a stable order
  (insertion order of the smallest set), so a seeded selection is reproducible.
* ``why_not(record, ...)`` says why one worker is not eligible; ``unsatisfiable(...)``
  turns that into the sentence an operator reads in an error.

Workers are identified by their store key (``WorkerRecord.key``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from dynamod.model import (
    DiscoveryEvent,
    ModelCard,
    TaintsUpdated,
    ViewResync,
    WorkerAdded,
    WorkerRecord,
    WorkerRemoved,
)
from dynamod.taints import CORDONED, RoutingConstraints

# How many workers an error message names before it says "and N more".
MESSAGE_WORKERS = 5

_EMPTY: dict[str, None] = {}


@dataclass(frozen=True)
class Ineligible:
    """Why one worker cannot take a request. At least one field is set."""

    missing: tuple[str, ...] = ()
    """Required taints the worker does not hold, sorted."""
    cordoned: bool = False
    """The worker holds ``dynamo.io/cordoned`` and the request does not require it."""
    excluded: bool = False
    """The request excluded this worker (e.g. a retry after it failed)."""

    def describe(self, record: WorkerRecord) -> str:
        """``a1b2 has capacity/slow (missing capacity/fast)``, ``c3d4 is cordoned``."""
        return f"{record.instance_id} {self.reason(record)}"

    def reason(self, record: WorkerRecord) -> str:
        """``has capacity/slow (missing capacity/fast)``: ``describe`` without the id."""
        parts = []
        if self.excluded:
            parts.append("is excluded by the request")
        if self.cordoned:
            parts.append("is cordoned")
        if self.missing:
            held = ", ".join(record.taints) or "no taints"
            parts.append(f"has {held} (missing {', '.join(self.missing)})")
        return " and ".join(parts)


class _ModelIndex:
    """The workers of one model and its inverted index. Dicts serve as ordered sets."""

    __slots__ = ("by_taint", "workers")

    def __init__(self) -> None:
        self.workers: dict[str, WorkerRecord] = {}
        self.by_taint: dict[str, dict[str, None]] = {}

    def add(self, record: WorkerRecord) -> None:
        self.workers[record.key] = record
        self._index(record.key, record.taints)

    def remove(self, key: str) -> None:
        record = self.workers.pop(key)
        self._unindex(key, record.taints)

    def retaint(self, old: WorkerRecord, new: WorkerRecord) -> None:
        """Replace a record of the same key, touching only the taints that changed."""
        before, after = set(old.taints), set(new.taints)
        self._unindex(new.key, before - after)
        self._index(new.key, after - before)
        self.workers[new.key] = new

    def _index(self, key: str, taints: Iterable[str]) -> None:
        for taint in taints:
            self.by_taint.setdefault(taint, {})[key] = None

    def _unindex(self, key: str, taints: Iterable[str]) -> None:
        for taint in taints:
            holders = self.by_taint[taint]
            del holders[key]
            if not holders:
                del self.by_taint[taint]


class RoutingTable:
    """Workers by model with a taint index; see the module docstring for the contract."""

    def __init__(self, records: Iterable[WorkerRecord] = ()) -> None:
        self._models: dict[str, _ModelIndex] = {}
        self._records: dict[str, WorkerRecord] = {}
        self._revisions: dict[str, int] = {}
        for record in records:
            self._upsert(record, 0)

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, key: object) -> bool:
        return key in self._records

    def get(self, key: str) -> WorkerRecord | None:
        return self._records.get(key)

    def models(self) -> list[str]:
        """Models that have at least one worker, sorted."""
        return sorted(self._models)

    def workers(self, model: str) -> list[WorkerRecord]:
        """Every worker of ``model``, eligible or not, in a stable order."""
        index = self._models.get(model)
        return list(index.workers.values()) if index else []

    def card(self, model: str) -> ModelCard | None:
        """The model card of ``model`` (its first worker's), or None when none serves it."""
        index = self._models.get(model)
        return next(iter(index.workers.values())).model_card if index else None

    def holders(self, model: str, taint: str) -> int:
        """How many workers of ``model`` hold ``taint``."""
        index = self._models.get(model)
        return len(index.by_taint.get(taint, _EMPTY)) if index else 0

    def apply(self, event: DiscoveryEvent) -> frozenset[str]:
        """Fold one discovery event in; return the models whose workers may have changed."""
        if isinstance(event, ViewResync):
            return self._resync(event)
        key = event.record.key
        if event.revision < self._revisions.get(key, event.revision):
            return frozenset()  # older than what the table already holds for this worker
        if isinstance(event, WorkerRemoved):
            return self._remove(key)
        assert isinstance(event, WorkerAdded | TaintsUpdated)
        return self._upsert(event.record, event.revision)

    def _resync(self, event: ViewResync) -> frozenset[str]:
        touched = set(self._models)
        self._models.clear()
        self._records.clear()
        self._revisions.clear()
        for record in event.records:
            self._upsert(record, event.revision)
        return frozenset(touched | set(self._models))

    def _upsert(self, record: WorkerRecord, revision: int) -> frozenset[str]:
        old = self._records.get(record.key)
        touched: frozenset[str] = frozenset()
        if old is not None and old.model == record.model:
            self._models[record.model].retaint(old, record)
        else:
            # A record that changed its model (never legal, yet possible in a resync after
            # a store was wiped) moves between indexes.
            touched = self._remove(record.key)
            self._models.setdefault(record.model, _ModelIndex()).add(record)
        self._records[record.key] = record
        self._revisions[record.key] = revision
        return touched | {record.model}

    def _remove(self, key: str) -> frozenset[str]:
        record = self._records.pop(key, None)
        self._revisions.pop(key, None)
        if record is None:
            return frozenset()
        index = self._models[record.model]
        index.remove(key)
        if not index.workers:
            del self._models[record.model]
        return frozenset({record.model})

    def eligible(
        self, model: str, constraints: RoutingConstraints, exclude: Collection[str] = ()
    ) -> list[WorkerRecord]:
        """Workers of ``model`` holding every required taint, not cordoned, not excluded."""
        return [record for _, record in self.eligible_items(model, constraints, exclude)]

    def eligible_items(
        self, model: str, constraints: RoutingConstraints, exclude: Collection[str] = ()
    ) -> list[tuple[str, WorkerRecord]]:
        """``eligible`` as (key, record) pairs, for callers that index by key."""
        index = self._models.get(model)
        if index is None:
            return []
        required = constraints.required_taints
        sets = [index.by_taint.get(taint, _EMPTY) for taint in required]
        sets.sort(key=len)
        base = sets.pop(0) if sets else index.workers
        cordoned = _EMPTY if CORDONED in required else index.by_taint.get(CORDONED, _EMPTY)
        keys = [key for key in base if key not in cordoned and key not in exclude]
        for holders in sets:  # each pass only shrinks the list; no per-key generator
            keys = [key for key in keys if key in holders]
        workers = index.workers
        return [(key, workers[key]) for key in keys]

    def why_not(
        self, record: WorkerRecord, constraints: RoutingConstraints, exclude: Collection[str] = ()
    ) -> Ineligible | None:
        """Why ``record`` is not eligible for ``constraints``; ``None`` when it is."""
        return why_not(record, constraints, exclude)

    def unsatisfiable(
        self, model: str, constraints: RoutingConstraints, exclude: Collection[str] = ()
    ) -> str:
        """The sentence for a request no worker can take: what it needs, what exists."""
        workers = self.workers(model)
        if not workers:
            others = ", ".join(repr(m) for m in self.models())
            known = f"workers serve {others}" if others else "no workers are registered"
            return f"no worker serves model {model!r}; {known}"
        required = constraints.required_taints
        need = f"has {' and '.join(sorted(required))}" if required else "is schedulable"
        reasons = [_reason(w, constraints, exclude) for w in workers[:MESSAGE_WORKERS]]
        more = len(workers) - MESSAGE_WORKERS
        tail = f", and {more} more" if more > 0 else ""
        count = f"{len(workers)} worker{'s' if len(workers) != 1 else ''}"
        return f"no worker of model {model!r} {need}; {count}: {', '.join(reasons)}{tail}"


def why_not(
    record: WorkerRecord, constraints: RoutingConstraints, exclude: Collection[str] = ()
) -> Ineligible | None:
    """The brute-force eligibility rule, one worker at a time (the index must agree)."""
    held = set(record.taints)
    required = constraints.required_taints
    missing = tuple(sorted(required - held))
    cordoned = CORDONED in held and CORDONED not in required
    excluded = record.key in exclude
    if missing or cordoned or excluded:
        return Ineligible(missing, cordoned, excluded)
    return None


def _reason(record: WorkerRecord, constraints: RoutingConstraints, exclude: Collection[str]) -> str:
    why = why_not(record, constraints, exclude)
    return why.describe(record) if why else f"{record.instance_id} is eligible"
