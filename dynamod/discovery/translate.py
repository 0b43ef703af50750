"""Translating store events into discovery events.

``EventTranslator`` is pure: it keeps the last known record of every worker and classifies each
store event against it. A same-key ``Put`` with equal content is nothing; one that changes
only taints is ``WorkerModified``; one that changes anything else is refused (logged with
the field, old value kept). A store ``Resync`` is reconciled against the known view into
``WorkerRemoved`` / ``WorkerAdded`` / ``WorkerModified`` events, then one ``ViewResync``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from dynamod.discovery_events import (
    DiscoveryEvent,
    ViewResync,
    WorkerAdded,
    WorkerModified,
    WorkerRemoved,
)
from dynamod.errors import ImmutableFieldError, InvalidInputError
from dynamod.records import WorkerRecord, immutable_diff
from dynamod.store import Delete, Entry, Resync, WatchEvent

log = logging.getLogger(__name__)


class EventTranslator:
    """The known records, and the discovery events each store event implies."""

    def __init__(self) -> None:
        self.known: dict[str, WorkerRecord] = {}
        self.revisions: dict[str, int] = {}
        self.revision = 0
        self.refused = 0

    def translate(self, event: WatchEvent) -> list[DiscoveryEvent]:
        self.revision = max(self.revision, event.revision)
        if isinstance(event, Resync):
            return list(self._resync(event))
        if isinstance(event, Delete):
            self.revisions.pop(event.key, None)
            gone = self.known.pop(event.key, None)
            return [] if gone is None else [WorkerRemoved(gone, event.revision)]
        found = self._put(event.entry)
        return [] if found is None else [found]

    def _put(self, entry: Entry) -> DiscoveryEvent | None:
        record = self._parse(entry)
        if record is None:
            return None
        old = self.known.get(entry.key)
        if old is None:
            self.known[entry.key] = record
            self.revisions[entry.key] = entry.revision
            return WorkerAdded(record, entry.revision)
        if old == record:
            self.revisions[entry.key] = entry.revision
            return None
        try:
            immutable_diff(old, record)
        except ImmutableFieldError as exc:
            self.refused += 1
            log.warning(
                "refusing change of worker %s at revision %d: %s", entry.key, entry.revision, exc
            )
            return None
        self.known[entry.key] = record
        self.revisions[entry.key] = entry.revision
        added = tuple(sorted(set(record.taints) - set(old.taints)))
        removed = tuple(sorted(set(old.taints) - set(record.taints)))
        return WorkerModified(record, added, removed, entry.revision)

    def _resync(self, event: Resync) -> Iterator[DiscoveryEvent]:
        present = {e.key for e in event.entries}
        for key in sorted(set(self.known) - present):
            self.revisions.pop(key, None)
            yield WorkerRemoved(self.known.pop(key), event.revision)
        for entry in event.entries:
            found = self._put(entry)
            if found is not None:
                yield found
        yield ViewResync(tuple(self.known[k] for k in sorted(self.known)), event.revision)

    def _parse(self, entry: Entry) -> WorkerRecord | None:
        try:
            record = WorkerRecord.from_bytes(entry.value)
        except InvalidInputError as exc:
            self.refused += 1
            log.warning("ignoring unreadable worker record %s: %s", entry.key, exc)
            return None
        if record.key != entry.key:
            self.refused += 1
            log.warning("ignoring worker record at %s: it names itself %s", entry.key, record.key)
            return None
        return record
