"""Dynamo's records of one fleet, joined into the worker records shown under our workers
prefix: the pure core of the Dynamo source (no I/O).

A worker is shown while both its model card and its endpoint record exist (Dynamo
registers the card first and, on a graceful stop, removes the endpoint first: either way
the worker is shown only while Dynamo's frontend can reach it). Its entry's revision is
the revision of the last change to any of its parts; its LoRA cards are listed with it.

``apply(event)`` takes one change of Dynamo's keys and returns the changes of the shown
entries, at that change's revision: a ``Put`` when the record or its revision changed,
a ``Delete`` when the worker went. A change of its LoRA adapters is a ``Delete`` and a
``Put`` at the same revision: dynamod's records change only in their taints, so a worker
whose adapters changed is shown as the worker leaving and coming back. Any other change
outside the taints is passed on as it is, and the worker view refuses it, keeping the
record it had, as Dynamo's frontend refuses it ("model update can only change
runtime_config.taints").
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dynamod.errors import InvalidKeyError
from dynamod.records import WorkerRecord
from dynamod.store.base import Delete, Entry, Put, in_prefix, validate_key
from dynamod.store.dynamo.addresses import SystemAddresses
from dynamod.store.dynamo.cards import NotUnderstood, Parts, RecordKind, worker_record
from dynamod.store.dynamo.keys import WorkerRef, parse_key

log = logging.getLogger(__name__)

Change = Put | Delete
REMEMBERED = 4096
"""How many refused records ``Refusals`` remembers, so each is reported once."""


class Refusals:
    """Reports each record that is not understood once per revision: one error in the log
    naming the key and why, and ``on_refused(kind)`` (the daemon's metric)."""

    def __init__(self, on_refused: Callable[[RecordKind], None] | None = None) -> None:
        self._on_refused = on_refused
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()
        self.count = 0

    def report(self, error: NotUnderstood, revision: int) -> None:
        seen = (error.key, revision)
        if seen in self._seen:
            return
        self._seen[seen] = None
        if len(self._seen) > REMEMBERED:
            self._seen.popitem(last=False)
        self.count += 1
        log.error("%s; that worker is left out (revision %d)", error, revision)
        if self._on_refused is not None:
            self._on_refused(error.kind)


@dataclass(frozen=True)
class Shown:
    entry: Entry
    record: WorkerRecord

    @property
    def loras(self) -> object:
        return self.record.model_card.extra.get("dynamo", {}).get("loras")


class Roster:
    """The joined state of one fleet; see the module docstring."""

    def __init__(self, addresses: SystemAddresses, refusals: Refusals) -> None:
        self._addresses = addresses
        self._refusals = refusals
        self._cards: dict[WorkerRef, Entry] = {}
        self._loras: dict[WorkerRef, dict[str, Entry]] = {}
        self._instances: dict[WorkerRef, Entry] = {}
        self._shown: dict[WorkerRef, Shown] = {}

    def load(self, entries: Iterable[Entry]) -> None:
        """Replace everything with a snapshot of Dynamo's keys."""
        self._cards.clear()
        self._loras.clear()
        self._instances.clear()
        touched = set()
        for entry in entries:
            ref = self._take(entry)
            if ref is not None:
                touched.add(ref)
        self._shown = {}
        for ref in touched:
            shown = self._join(ref, None)
            if shown is not None:
                self._shown[ref] = shown

    def apply(self, change: Change) -> list[Change]:
        """The changes of the shown entries that one change of Dynamo's keys makes."""
        ref = self._take(change.entry) if isinstance(change, Put) else self._drop(change.key)
        if ref is None:
            return []
        old, new = self._shown.get(ref), self._join(ref, change.revision)
        if new is None:
            self._shown.pop(ref, None)
        else:
            self._shown[ref] = new
        return _difference(ref, old, new, change.revision)

    def entries(self, prefix: str = "") -> list[Entry]:
        """The shown entries under ``prefix``, sorted by key."""
        found = [s.entry for s in self._shown.values() if in_prefix(s.entry.key, prefix)]
        return sorted(found, key=lambda e: e.key)

    def entry(self, ref: WorkerRef) -> Entry | None:
        shown = self._shown.get(ref)
        return None if shown is None else shown.entry

    def __len__(self) -> int:
        return len(self._shown)

    # -- Dynamo's keys ---------------------------------------------------------------------

    def _take(self, entry: Entry) -> WorkerRef | None:
        found = parse_key(entry.key)
        if found is None:
            return None
        if found.kind == "card":
            self._cards[found.worker] = entry
        elif found.kind == "instance":
            self._instances[found.worker] = entry
        else:
            self._loras.setdefault(found.worker, {})[found.lora] = entry
        return found.worker

    def _drop(self, key: str) -> WorkerRef | None:
        found = parse_key(key)
        if found is None:
            return None
        ref = found.worker
        if found.kind == "card":
            self._cards.pop(ref, None)
        elif found.kind == "instance":
            self._instances.pop(ref, None)
        else:
            adapters = self._loras.get(ref, {})
            adapters.pop(found.lora, None)
            if not adapters:
                self._loras.pop(ref, None)
        return ref

    def _join(self, ref: WorkerRef, revision: int | None) -> Shown | None:
        """The worker as shown, at ``revision`` (None: its newest part's)."""
        card, instance = self._cards.get(ref), self._instances.get(ref)
        if card is None or instance is None:
            return None
        adapters = self._loras.get(ref, {})
        parts = Parts(card, instance, tuple(adapters[name] for name in sorted(adapters)))
        try:
            _check_key(ref)
            record = worker_record(ref, parts, self._addresses, tuple(sorted(adapters)))
            value = _shown_bytes(record, card.key)
        except NotUnderstood as exc:
            self._refusals.report(exc, parts.revision)
            return None
        at = parts.revision if revision is None else revision
        return Shown(Entry(ref.shown_key, value, at), record)


def _shown_bytes(record: WorkerRecord, key: str) -> bytes:
    try:
        return record.to_bytes()
    except ValueError as exc:  # NaN or infinity: JSON that Python reads but cannot write
        raise NotUnderstood(key, "card", f"holds a number JSON cannot carry ({exc})") from None


def _check_key(ref: WorkerRef) -> None:
    try:
        validate_key(ref.shown_key)
    except InvalidKeyError as exc:
        raise NotUnderstood(
            ref.card_key, "card", f"its namespace, component or endpoint cannot be shown: {exc}"
        ) from None


def join_one(
    ref: WorkerRef, entries: Iterable[Entry], addresses: SystemAddresses, refusals: Refusals
) -> Entry | None:
    """One worker as shown, from Dynamo's keys of it (a fresh read)."""
    roster = Roster(addresses, refusals)
    roster.load(entries)
    return roster.entry(ref)


def _difference(ref: WorkerRef, old: Shown | None, new: Shown | None, at: int) -> list[Change]:
    if new is None:
        return [] if old is None else [Delete(ref.shown_key, at)]
    if old is None:
        return [Put(new.entry)]
    if old.loras != new.loras:
        return [Delete(ref.shown_key, at), Put(new.entry)]
    return [] if old.entry == new.entry else [Put(new.entry)]
