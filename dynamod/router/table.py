"""The routing table: which workers exist, per model, and which of them a request may use.

Pure and synchronous: no asyncio, no I/O, no clock. One ``RoutingTable`` folds discovery
events into workers grouped by model, and within a model into ``Group``s of workers with
the same taints, reading and context length (``groups.py``): eligibility is decided per
group.

* ``apply(event)`` costs O(taints of that worker + log n); a ``ViewResync`` rebuilds
  everything.
* Every worker remembers the revision of the event that last wrote it, and an event older
  than that is ignored. So adds and taint updates converge to the newest record whatever
  order they arrive in; only a removal followed by an *older* add of the same worker is
  order-dependent (a removal leaves no tombstone: the key is gone, and so is its revision).
* ``WorkerModified`` for a worker the table does not know adds it: the event carries the
  whole record, so there is nothing to gain by dropping it.
* ``eligible_groups(model, required)``: the groups holding every required taint, without
  the cordoned ones (``dynamo.io/cordoned``; drained ones also hold ``dynamo.io/draining``)
  unless the request requires those very taints.
  O(groups of the model) the first time a set of required taints is asked for, then
  cached until a group appears or disappears; with ``needs`` (``fit.CardNeeds``), only
  those whose card offers it (the cached tuple itself when every one does).
  ``eligible(model, constraints, exclude)`` lists their workers without the excluded keys,
  in a stable order (group by group, each in arrival order), so a seeded selection is
  reproducible.
* ``reading(model)``: how the front reads the model's bodies (``fit.ModelReading``: the
  reading most of its workers publish), kept per model and recomputed after a change of
  its workers in O(groups + distinct readings).
* Each group's ``free`` order holds its members that are not busy, by the rank the table's
  ``ranker`` gives (the router's loads); the owner calls ``rerank(key)`` when a worker's
  load changes.
* ``why_not(record, ...)`` says why one worker is not eligible; ``unsatisfiable(...)``
  turns that into the sentence an operator reads in an error.

Workers are identified by their store key (``WorkerRecord.key``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from dynamod.discovery_events import (
    DiscoveryEvent,
    ViewResync,
    WorkerAdded,
    WorkerModified,
    WorkerRemoved,
)
from dynamod.records import ModelCard, WorkerRecord
from dynamod.router.fit import ANY, CardNeeds, ModelReading, Reading, forwards
from dynamod.router.groups import Group
from dynamod.taints import OPERATOR_TAINTS, RoutingConstraints

# How many workers an error message names before it says "and N more".
MESSAGE_WORKERS = 5
EXCLUDED_NAMED = 3
"""Excluded workers (another reading) a refusal names, after the others."""
MESSAGE_TAINTS = 16
"""Taints a message names in one list (required, missing, held); then ``(and N more)``: a
request may name 10,000 required taints, and its 503 must stay a sentence."""

# Sets of required taints whose eligible groups are remembered per model; past this many
# the memory starts over (so odd constraints sent by clients cannot grow it without end).
ELIGIBLE_CACHE = 1024

Ranker = Callable[[WorkerRecord], float | None]
"""A worker's rank in its group's ``free`` order, or None when it is busy."""

_GroupKey = tuple[frozenset[str], Reading, int]
"""(taints, reading, context length): what the members of one group share."""


def _idle(record: WorkerRecord) -> float:
    return 0.0


@dataclass(frozen=True)
class Ineligible:
    """Why one worker cannot take a request. At least one field is set."""

    missing: tuple[str, ...] = ()
    """Required taints the worker does not hold, sorted."""
    cordoned: bool = False
    """The worker holds ``dynamo.io/cordoned`` (or ``dynamo.io/draining``) and the request
    does not require it."""
    excluded: bool = False
    """The request excluded this worker (e.g. a retry after it failed)."""
    other_reading: Reading | None = None
    """The worker reads bodies otherwise (this reading) than the request was read."""
    short_context: int = 0
    """The context the request needs, which the worker's is shorter than (0: no such
    problem)."""

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
            held = named(record.taints, ", ") or "no taints"
            parts.append(f"has {held} (missing {named(self.missing, ', ')})")
        if self.other_reading is not None:
            parts.append(
                f"disagrees with the model's other workers ({self.other_reading.describe()})"
            )
        if self.short_context:
            parts.append(
                f"has a context of {record.model_card.context_length} tokens "
                f"(the request needs {self.short_context})"
            )
        return " and ".join(parts)


class _ModelIndex:
    """The workers of one model (arrival order), its groups, and the eligibility cache."""

    __slots__ = ("chosen", "eligible", "forwarding", "groups", "readings", "workers")

    def __init__(self) -> None:
        self.workers: dict[str, WorkerRecord] = {}
        self.groups: dict[_GroupKey, Group] = {}
        self.eligible: dict[frozenset[str], tuple[Group, ...]] = {}
        self.readings: dict[Reading, int] = {}
        """Workers per reading, in the order the readings appeared (ties go to the first)."""
        self.forwarding: dict[Reading, int] = {}
        """Workers per reading whose engine forwards bodies (``fit.forwards``)."""
        self.chosen: ModelReading | None = None
        """``reading(model)``, once computed since the last change of the workers."""

    def count(self, card: ModelCard, change: int) -> None:
        reading = Reading.of(card)
        _add(self.readings, reading, change)
        if forwards(card):
            _add(self.forwarding, reading, change)
        self.chosen = None

    def reading(self) -> ModelReading:
        if self.chosen is None:
            self.chosen = self._choose()
        return self.chosen

    def _choose(self) -> ModelReading:
        reading, workers = max(self.readings.items(), key=lambda item: item[1])
        ours = [g for g in self.groups.values() if g.reading == reading]
        card = next(iter(ours[0].members.values())).model_card
        contexts = tuple(sorted({g.context_length for g in ours}))
        disagreeing = len(self.workers) - workers
        checked = reading not in self.forwarding
        return ModelReading(reading, card, contexts, workers, disagreeing, checked)


def _add(counts: dict[Reading, int], reading: Reading, change: int) -> None:
    left = counts.get(reading, 0) + change
    if left:
        counts[reading] = left
    else:
        del counts[reading]


class RoutingTable:
    """Workers by model, in groups; see the module docstring for the contract."""

    def __init__(self, records: Iterable[WorkerRecord] = (), *, ranker: Ranker = _idle) -> None:
        self._ranker = ranker
        self._models: dict[str, _ModelIndex] = {}
        self._records: dict[str, WorkerRecord] = {}
        self._revisions: dict[str, int] = {}
        self._groups: dict[str, Group] = {}
        for record in records:
            self._upsert(record, 0)

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, key: object) -> bool:
        return key in self._records

    def get(self, key: str) -> WorkerRecord | None:
        return self._records.get(key)

    def group_of(self, key: str) -> Group | None:
        """The group of the worker ``key``, or None when the table does not hold it."""
        return self._groups.get(key)

    def models(self) -> list[str]:
        """Models that have at least one worker, sorted."""
        return sorted(self._models)

    def workers(self, model: str) -> list[WorkerRecord]:
        """Every worker of ``model``, eligible or not, in arrival order."""
        index = self._models.get(model)
        return list(index.workers.values()) if index else []

    def groups(self, model: str) -> list[Group]:
        """Every group of ``model``."""
        index = self._models.get(model)
        return list(index.groups.values()) if index else []

    def card(self, model: str) -> ModelCard | None:
        """A model card of ``model``'s workers, of the reading most of them publish (see
        ``reading``); None when none serves it."""
        chosen = self.reading(model)
        return chosen.card if chosen is not None else None

    def reading(self, model: str) -> ModelReading | None:
        """How the front reads ``model``'s bodies (``fit.py``); None when none serves it."""
        index = self._models.get(model)
        return index.reading() if index is not None else None

    def disagreeing(self, model: str) -> int:
        """How many workers of ``model`` publish another reading than most of them do (left
        out of routing: ``fit.py``); O(distinct readings of the model)."""
        index = self._models.get(model)
        if index is None or len(index.readings) < 2:
            return 0
        return len(index.workers) - max(index.readings.values())

    def disagreement(self, record: WorkerRecord) -> str:
        """Why ``record``'s worker is left out of routing for its reading (it disagrees with
        most of its model's workers, ``fit.py``), or ""; O(1) for a model that agrees."""
        index = self._models.get(record.model)
        if index is None or len(index.readings) < 2 or record.key not in index.workers:
            return ""
        chosen, reading = index.reading().reading, Reading.of(record.model_card)
        if reading == chosen:
            return ""
        return (
            f"its reading ({reading.describe()}) disagrees with its model's other workers "
            f"({chosen.describe()}); left out of routing"
        )

    def holders(self, model: str, taint: str) -> int:
        """How many workers of ``model`` hold ``taint``."""
        index = self._models.get(model)
        groups = index.groups.values() if index else ()
        return sum(len(g.members) for g in groups if taint in g.held)

    def apply(self, event: DiscoveryEvent) -> frozenset[str]:
        """Fold one discovery event in; return the models whose workers may have changed."""
        if isinstance(event, ViewResync):
            return self._resync(event)
        key = event.record.key
        if event.revision < self._revisions.get(key, event.revision):
            return frozenset()  # older than what the table already holds for this worker
        if isinstance(event, WorkerRemoved):
            return self._remove(key)
        assert isinstance(event, WorkerAdded | WorkerModified)
        return self._upsert(event.record, event.revision)

    def rerank(self, key: str | None = None) -> None:
        """Ask the ranker again for the worker ``key`` (its load changed), or for every
        worker (the ranking rule changed)."""
        keys: Iterable[str] = self._groups if key is None else (key,)
        for each in keys:
            group = self._groups.get(each)
            if group is not None:
                self._place(group, group.members[each])

    def _place(self, group: Group, record: WorkerRecord) -> None:
        rank = self._ranker(record)
        if rank is None:
            group.free.discard(record.key)
        else:
            group.free.put(record.key, rank)

    def _resync(self, event: ViewResync) -> frozenset[str]:
        touched = set(self._models)
        self._models.clear()
        self._records.clear()
        self._revisions.clear()
        self._groups.clear()
        for record in event.records:
            self._upsert(record, event.revision)
        return frozenset(touched | set(self._models))

    def _upsert(self, record: WorkerRecord, revision: int) -> frozenset[str]:
        key = record.key
        old = self._records.get(key)
        touched: frozenset[str] = frozenset()
        if old is not None and old.model != record.model:
            # A record that changed its model (never legal, yet possible in a resync after
            # a store was wiped) moves between indexes.
            touched = self._remove(key)
            old = None
        index = self._models.get(record.model)
        if index is None:
            index = self._models[record.model] = _ModelIndex()
        # A taint change keeps the very card object (discovery/translate.py's fast path):
        # its reading is the group's, counted already.
        same_card = old is not None and old.model_card is record.model_card
        if old is not None and not same_card:
            index.count(old.model_card, -1)
        if not same_card:
            index.count(record.model_card, +1)
        index.workers[key] = record
        self._records[key] = record
        self._revisions[key] = revision
        self._regroup(index, record, same_card)
        return touched | {record.model}

    def _regroup(self, index: _ModelIndex, record: WorkerRecord, same_card: bool) -> None:
        """Put ``record`` in the group its taints, reading and context length name
        (``same_card``: its card is the very one its group was chosen by)."""
        key = record.key
        card = record.model_card
        group = self._groups.get(key)
        reading = group.reading if same_card and group is not None else Reading.of(card)
        wanted = (frozenset(record.taints), reading, card.context_length)
        if group is not None and _key(group) == wanted:
            group.members[key] = record
            return
        if group is not None:
            self._leave(index, group, key)
        group = index.groups.get(wanted)
        if group is None:
            taints = tuple(sorted(wanted[0]))
            group = Group(record.model, taints, wanted[1], wanted[2])
            index.groups[wanted] = group
            index.eligible.clear()
        group.members[key] = record
        self._groups[key] = group
        self._place(group, record)

    def _leave(self, index: _ModelIndex, group: Group, key: str) -> None:
        del group.members[key]
        group.free.discard(key)
        del self._groups[key]
        if not group.members:
            del index.groups[_key(group)]
            index.eligible.clear()

    def _remove(self, key: str) -> frozenset[str]:
        record = self._records.pop(key, None)
        self._revisions.pop(key, None)
        if record is None:
            return frozenset()
        index = self._models[record.model]
        del index.workers[key]
        index.count(record.model_card, -1)
        self._leave(index, self._groups[key], key)
        if not index.workers:
            del self._models[record.model]
        return frozenset({record.model})

    def eligible_groups(
        self, model: str, required: frozenset[str], needs: CardNeeds = ANY
    ) -> tuple[Group, ...]:
        """The groups of ``model`` whose workers a request requiring ``required`` (and
        ``needs`` of a card) may use (module docstring); cached per set of required taints.
        Every group that suits ``needs`` returns the cached tuple itself, so callers may
        remember what they computed from it by identity."""
        index = self._models.get(model)
        if index is None:
            return ()
        found = index.eligible.get(required)
        if found is None:
            if len(index.eligible) >= ELIGIBLE_CACHE:
                index.eligible.clear()
            found = tuple(g for g in index.groups.values() if g.admits(required))
            index.eligible[required] = found
        if needs == ANY or all(g.suits(needs) for g in found):
            return found
        return tuple(g for g in found if g.suits(needs))

    def eligible(
        self,
        model: str,
        constraints: RoutingConstraints,
        exclude: Collection[str] = (),
        needs: CardNeeds = ANY,
    ) -> list[WorkerRecord]:
        """Workers of ``model`` holding every required taint, not cordoned, not excluded,
        whose card offers what ``needs`` asks."""
        groups = self.eligible_groups(model, constraints.required_taints, needs)
        return [r for g in groups for k, r in g.members.items() if k not in exclude]

    def why_not(
        self,
        record: WorkerRecord,
        constraints: RoutingConstraints,
        exclude: Collection[str] = (),
        needs: CardNeeds = ANY,
    ) -> Ineligible | None:
        """Why ``record`` is not eligible for ``constraints``; ``None`` when it is."""
        return why_not(record, constraints, exclude, needs)

    def unsatisfiable(
        self,
        model: str,
        constraints: RoutingConstraints,
        exclude: Collection[str] = (),
        needs: CardNeeds = ANY,
    ) -> str:
        """The sentence for a request no worker can take: what it needs, what exists."""
        index = self._models.get(model)
        if index is None:
            others = ", ".join(repr(m) for m in self.models())
            known = f"workers serve {others}" if others else "no workers are registered"
            return f"no worker serves model {model!r}; {known}"
        required = constraints.required_taints
        need = f"has {named(sorted(required), ' and ')}" if required else "is schedulable"
        workers: Collection[WorkerRecord] = index.workers.values()
        apart: list[WorkerRecord] = []
        if needs.reading is not None:
            # The disagreeing workers are named apart, after the others, and a few only:
            # they may be many, and a hostile record must not crowd the honest ones out.
            ours = [w for w in workers if Reading.of(w.model_card) == needs.reading]
            apart = [w for w in workers if Reading.of(w.model_card) != needs.reading]
            workers = ours
        if any(w.model_card.context_length < needs.context for w in workers):
            need += f" and a context that holds {needs.tokens or needs.context} tokens"
        shown = itertools.islice(workers, MESSAGE_WORKERS)
        reasons = [_reason(w, constraints, exclude, needs) for w in shown]
        told = f"no worker of model {model!r} {need}; {_count_of(len(workers), reasons)}"
        return told + _left_out(apart, needs)


def _left_out(workers: list[WorkerRecord], needs: CardNeeds) -> str:
    """``; 1 more worker excluded, its reading disagreeing with the model's other workers'
    (…): a1b2 (no tokenizer, block size 16)``: the workers left out of routing by design."""
    if not workers or needs.reading is None:
        return ""
    shown = [
        f"{w.instance_id} ({Reading.of(w.model_card).describe()})"
        for w in itertools.islice(workers, EXCLUDED_NAMED)
    ]
    more = len(workers) - len(shown)
    tail = f", and {more} more" if more > 0 else ""
    plural = "s" if len(workers) != 1 else ""
    return (
        f"; {len(workers)} more worker{plural} excluded, reading bodies otherwise than the "
        f"model's other workers ({needs.reading.describe()}): {', '.join(shown)}{tail}"
    )


def _count_of(total: int, shown: list[str]) -> str:
    """``2 workers: a, b`` / ``7 workers: a, ..., e, and 2 more``."""
    more = total - len(shown)
    tail = f", and {more} more" if more > 0 else ""
    return f"{total} worker{'s' if total != 1 else ''}: {', '.join(shown)}{tail}"


def named(taints: Collection[str], sep: str, limit: int = MESSAGE_TAINTS) -> str:
    """The first ``limit`` of ``taints`` (in their order) joined by ``sep``, then ``(and N
    more)``; each cut to 100 characters (a taint may be kilobytes)."""
    items = list(itertools.islice(taints, limit))
    text = sep.join(t if len(t) <= 100 else f"{t[:100]}..." for t in items)
    more = len(taints) - len(items)
    return f"{text} (and {more} more)" if more > 0 else text


def why_not(
    record: WorkerRecord,
    constraints: RoutingConstraints,
    exclude: Collection[str] = (),
    needs: CardNeeds = ANY,
) -> Ineligible | None:
    """The brute-force eligibility rule, one worker at a time (the groups must agree)."""
    held = set(record.taints)
    required = constraints.required_taints
    missing = tuple(sorted(required - held))
    cordoned = bool((held & OPERATOR_TAINTS) - required)
    excluded = record.key in exclude
    reading = Reading.of(record.model_card)
    other = reading if needs.reading is not None and needs.reading != reading else None
    short = needs.tokens or needs.context if record.model_card.context_length < needs.context else 0
    if missing or cordoned or excluded or other or short:
        return Ineligible(missing, cordoned, excluded, other, short)
    return None


def _key(group: Group) -> _GroupKey:
    return (group.held, group.reading, group.context_length)


def _reason(
    record: WorkerRecord,
    constraints: RoutingConstraints,
    exclude: Collection[str],
    needs: CardNeeds,
) -> str:
    why = why_not(record, constraints, exclude, needs)
    return why.describe(record) if why else f"{record.instance_id} is eligible"
