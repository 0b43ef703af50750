"""Dynamo's records of one fleet, joined into the worker records shown under our workers
prefix: the pure core of the Dynamo source (no I/O).

A worker is shown while both its model card and its endpoint record exist (Dynamo
registers the card first and, on a graceful stop, removes the endpoint first: either way
the worker is shown only while Dynamo's frontend can reach it). Its entry's revision is
the revision of the last change to either.

``apply(change)`` takes one change of Dynamo's keys and returns the changes of the shown
entries, at that change's revision: a ``Put`` when the record or its revision changed, a
``Delete`` when the worker went. Any other change outside the taints is passed on as it
is, and the worker view refuses it, keeping the record it had, as Dynamo's frontend
refuses it ("model update can only change runtime_config.taints").

**LoRA cards cost O(1) each.** A LoRA adapter's card is a Dynamo model of its own, served
by the worker; nothing dynamod routes, lists or re-taints depends on it (Dynamo's taint
route and its routers read only the base card). So an adapter's card is never read: its
name is added to (or removed from) the worker's set of adapters, and the shown worker
does not change. ``adapters(ref)`` answers which it serves (``workers get``).

**A refused record leaves nothing behind.** A card or endpoint record over
``MAX_RECORD_BYTES`` is kept as a ``TooLarge`` (key, size, revision), never as bytes, and
refused as such; a record not understood is reported once per revision (``Refusals``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from dynamod.errors import InvalidInputError, InvalidKeyError
from dynamod.records import WorkerRecord
from dynamod.store.base import Delete, Entry, Put, in_prefix, validate_key
from dynamod.store.dynamo.addresses import SystemAddresses
from dynamod.store.dynamo.cards import (
    NotUnderstood,
    Part,
    Parts,
    RecordKind,
    TooLarge,
    bounded,
    taint_warnings,
    worker_record,
)
from dynamod.store.dynamo.keys import WorkerRef, parse_key

log = logging.getLogger(__name__)

Change = Put | Delete | TooLarge
"""One change of Dynamo's keys: a ``TooLarge`` is a put whose value was not kept."""
REMEMBERED = 4096
"""How many reports ``Refusals`` remembers, so each is made once."""


class Refusals:
    """Reports, once per record and revision, what the reader says of Dynamo's records: a
    record not understood (one error naming the key and why, and ``on_refused(kind)``,
    the daemon's ``dynamod_dynamo_records_refused_total``), and a worker read with
    warnings (``cards.taint_warnings``: one warning line each, and ``on_warned()``, its
    ``dynamod_dynamo_taint_warnings_total``)."""

    def __init__(
        self,
        on_refused: Callable[[RecordKind], None] | None = None,
        on_warned: Callable[[], None] | None = None,
    ) -> None:
        self._on_refused = on_refused
        self._on_warned = on_warned
        self._seen: OrderedDict[tuple[str, str, int], None] = OrderedDict()
        self.count = 0
        self.warnings = 0

    def report(self, error: NotUnderstood, revision: int) -> None:
        if not self._first("refused", error.key, revision):
            return
        self.count += 1
        # The message, not the error: a record a handler keeps must not keep the error's
        # traceback, and with it the record's bytes.
        log.error("%s; that worker is left out (revision %d)", str(error), revision)
        if self._on_refused is not None:
            self._on_refused(error.kind)

    def warn(self, key: str, revision: int, warnings: Iterable[str]) -> None:
        if not self._first("warned", key, revision):
            return
        for said in warnings:
            self.warnings += 1
            log.warning("Dynamo worker %s %s (revision %d)", key, said, revision)
            if self._on_warned is not None:
                self._on_warned()

    def _first(self, what: str, key: str, revision: int) -> bool:
        seen = (what, key, revision)
        if seen in self._seen:
            return False
        self._seen[seen] = None
        if len(self._seen) > REMEMBERED:
            self._seen.popitem(last=False)
        return True


@dataclass(frozen=True)
class Shown:
    entry: Entry
    record: WorkerRecord


class Roster:
    """The joined state of one fleet; see the module docstring."""

    def __init__(self, addresses: SystemAddresses, refusals: Refusals) -> None:
        self._addresses = addresses
        self._refusals = refusals
        self._cards: dict[WorkerRef, Part] = {}
        self._instances: dict[WorkerRef, Part] = {}
        self._loras: dict[WorkerRef, set[str]] = {}
        self._shown: dict[WorkerRef, Shown] = {}
        self.too_large = 0
        """How many records over ``MAX_RECORD_BYTES`` it was handed (and did not keep)."""

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
            shown = self._join(ref)
            if shown is not None:
                self._shown[ref] = shown

    def apply(self, change: Change) -> list[Put | Delete]:
        """The changes of the shown entries that one change of Dynamo's keys makes."""
        found = parse_key(change.key)
        if found is None:
            return []
        ref = found.worker
        if found.kind == "lora":
            self._adapter(ref, found.lora, present=not isinstance(change, Delete))
            return []
        parts = self._cards if found.kind == "card" else self._instances
        if isinstance(change, Delete):
            parts.pop(ref, None)
        else:
            parts[ref] = change if isinstance(change, TooLarge) else self._bounded(change.entry)
        old, new = self._shown.get(ref), self._join(ref)
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

    def adapters(self, ref: WorkerRef) -> Collection[str]:
        """The names of the LoRA adapters worker ``ref`` has cards for (unordered)."""
        return self._loras.get(ref, ())

    def __len__(self) -> int:
        return len(self._shown)

    # -- Dynamo's keys ---------------------------------------------------------------------

    def _take(self, entry: Entry) -> WorkerRef | None:
        found = parse_key(entry.key)
        if found is None:
            return None
        if found.kind == "card":
            self._cards[found.worker] = self._bounded(entry)
        elif found.kind == "instance":
            self._instances[found.worker] = self._bounded(entry)
        else:
            self._adapter(found.worker, found.lora, present=True)
        return found.worker

    def _bounded(self, entry: Entry) -> Part:
        part = bounded(entry)
        if isinstance(part, TooLarge):
            self.too_large += 1
        return part

    def _adapter(self, ref: WorkerRef, name: str, *, present: bool) -> None:
        if present:
            self._loras.setdefault(ref, set()).add(name)
            return
        names = self._loras.get(ref)
        if names is not None:
            names.discard(name)
            if not names:
                del self._loras[ref]

    def _join(self, ref: WorkerRef) -> Shown | None:
        """The worker as shown, at its newer part's revision."""
        card, instance = self._cards.get(ref), self._instances.get(ref)
        if card is None or instance is None:
            return None
        parts = Parts(card, instance)
        try:
            _check_key(ref)
            record = worker_record(ref, parts, self._addresses)
            value = _shown_bytes(record, card.key)
        except NotUnderstood as exc:
            self._refusals.report(exc, parts.revision)
            return None
        warnings = taint_warnings(record)
        if warnings:
            self._refusals.warn(card.key, parts.revision, warnings)
        return Shown(Entry(ref.view_key, value, parts.revision), record)


def _shown_bytes(record: WorkerRecord, key: str) -> bytes:
    """The record's bytes, read back as the worker view will read them: whatever it would
    refuse is refused here, under Dynamo's key."""
    try:
        value = record.to_bytes()
    except ValueError as exc:  # NaN or infinity: JSON that Python reads but cannot write
        raise NotUnderstood(key, "card", f"holds a number JSON cannot carry ({exc})") from None
    try:
        WorkerRecord.from_bytes(value)
    except InvalidInputError as exc:
        reason = f"reads as a worker record dynamod refuses: {exc}"
        raise NotUnderstood(key, "card", reason) from None
    return value


def _check_key(ref: WorkerRef) -> None:
    try:
        validate_key(ref.view_key)
    except InvalidKeyError as exc:
        raise NotUnderstood(
            ref.card_key, "card", f"its namespace, component or endpoint cannot be shown: {exc}"
        ) from None


def _difference(
    ref: WorkerRef, old: Shown | None, new: Shown | None, at: int
) -> list[Put | Delete]:
    if new is None:
        return [] if old is None else [Delete(ref.view_key, at)]
    if old is None:
        return [Put(new.entry)]
    return [] if old.entry == new.entry else [Put(new.entry)]
