"""Taint updates of worker records: compare-and-swap at the revision that was read.

After registration (``registration.py``) only a record's caller-managed taints change,
and every such change goes through ``update_taints``, so concurrent updates from many
processes never lose one. ``within_boundary`` and ``parse_stored`` say which record
routers hold when the stored one was changed out of band; ``Registration`` uses them too.
"""

from __future__ import annotations

import logging

from dynamod.backoff import Backoff
from dynamod.errors import (
    ConflictError,
    DynamoError,
    ImmutableFieldError,
    InvalidInputError,
    KeyNotFoundError,
    RevisionMismatchError,
    WorkerNotFoundError,
)
from dynamod.records import TaintCheck, WorkerRecord, immutable_diff
from dynamod.results import UpdateOutcome
from dynamod.store import KEEP, Store
from dynamod.taints import TaintLimits, TaintUpdate

log = logging.getLogger(__name__)

CAS_ATTEMPTS = 8
BACKOFF_FIRST = 0.002
BACKOFF_CAP = 0.05


async def update_taints(
    store: Store,
    key: str,
    update: TaintUpdate,
    *,
    expect_revision: int | None = None,
    check: TaintCheck | None = None,
    base: WorkerRecord | None = None,
    limits: TaintLimits | None = None,
    base_revision: int | None = None,
) -> UpdateOutcome:
    """Apply ``update`` to the worker record at ``key`` atomically; return what changed.

    Read → compute on the freshly read taints → unchanged: return without writing →
    compare-and-swap at the read revision, keeping the worker's lease. A lost race waits a
    jittered, growing moment (``dynamod.backoff``: up to 2 ms, doubling to 50 ms) so that
    writers in several processes stop colliding, re-reads and retries, at most
    ``CAS_ATTEMPTS`` times, then raises the retryable ``ConflictError`` with the attempts
    made. With ``expect_revision`` a record
    at another revision fails at once with ``RevisionMismatchError`` (the caller's
    optimistic lock). A missing worker raises ``WorkerNotFoundError``.
    ``check(before, after)`` runs before each write and may raise to refuse it (access
    control on the taints actually changed). ``limits`` bound the taints an update may leave
    (``TaintLimitError``, permanent, nothing written).

    ``base`` is the record as registered (a worker's own, or a router's view of it). A
    stored record that differs from it outside the taints was changed out of band, and
    routers ignore it: the update is then computed on ``base`` and written over it, so
    that what the call reports is what routers see.

    ``base_revision`` is the store revision ``base`` was seen at (a router's view, or a
    worker following its own record). When it is ``expect_revision``, the record is known:
    the read is skipped and the compare-and-swap alone checks the revision (one store round
    trip instead of two; the pool leader writes this way, at the revision its plan saw).
    Without ``expect_revision`` it is a guess (``_write_at_guess``): tried first, without a
    read, and read for only when the guess is not borne out.
    """
    if base is not None and base_revision is not None and expect_revision is None:
        guessed = await _write_at_guess(store, key, update, base, base_revision, check, limits)
        if guessed is not None:
            return guessed
    backoff = Backoff(BACKOFF_FIRST, BACKOFF_CAP)
    known = base is not None and expect_revision is not None and base_revision == expect_revision
    stored: WorkerRecord | None
    for attempt in range(1, CAS_ATTEMPTS + 1):
        if known:
            assert base is not None and expect_revision is not None
            revision, stored, before = expect_revision, base, base
        else:
            entry = await store.get(key)
            if entry is None:
                raise WorkerNotFoundError(key, f"no worker is registered at {key!r}")
            revision = entry.revision
            if expect_revision is not None and revision != expect_revision:
                raise RevisionMismatchError(key, expect_revision, revision)
            stored = parse_stored(entry.value, key, base)
            before = within_boundary(base, stored)
        after = before.updated(update, limits)
        if after == stored:
            return _change(before, after, revision)
        if check is not None:
            check(before, after)
        try:
            new_revision = await store.put(key, after.to_bytes(), expect=revision, lease=KEEP)
        except KeyNotFoundError:
            raise WorkerNotFoundError(key, f"worker {key!r} went away during the update") from None
        except RevisionMismatchError:
            if expect_revision is not None:
                raise
            if attempt < CAS_ATTEMPTS:
                await backoff.wait()
            continue
        return _change(before, after, new_revision)
    raise ConflictError(
        f"taint update of {key!r} lost the compare-and-swap race {CAS_ATTEMPTS} times in a "
        f"row ({CAS_ATTEMPTS} attempts) to concurrent writers; retry the call",
        attempts=CAS_ATTEMPTS,
    )


async def _write_at_guess(
    store: Store,
    key: str,
    update: TaintUpdate,
    base: WorkerRecord,
    revision: int,
    check: TaintCheck | None,
    limits: TaintLimits | None,
) -> UpdateOutcome | None:
    """The update written over ``base`` at ``revision`` in one compare-and-swap, on the
    guess that the store still holds ``base`` there; None where only a read can tell: the
    guess says nothing changes or refuses the update (both may be stale), or the store holds
    another revision (another writer got there first) or no record. A compare-and-swap that
    succeeds proves the guess, so what it reports is what a read would have found."""
    try:
        after = base.updated(update, limits)
        if after == base:
            return None
        if check is not None:
            check(base, after)
    except DynamoError:
        return None
    try:
        written = await store.put(key, after.to_bytes(), expect=revision, lease=KEEP)
    except (RevisionMismatchError, KeyNotFoundError):
        return None
    return _change(base, after, written)


def within_boundary(base: WorkerRecord | None, stored: WorkerRecord | None) -> WorkerRecord:
    """``stored``, or ``base`` when ``stored`` is unreadable (None) or differs from it
    outside the taints: what routers hold for this worker."""
    if base is None:
        assert stored is not None  # _parse raised
        return stored
    problem = "it is not a readable worker record"
    if stored is not None:
        try:
            immutable_diff(base, stored)
        except ImmutableFieldError as exc:
            problem = str(exc)
        else:
            return stored
    log.warning(
        "worker record %s was changed out of band (%s); routers ignore that change, so the "
        "registered record is written back with its latest valid taints",
        base.key,
        problem,
    )
    return base


def parse_stored(value: bytes, key: str, base: WorkerRecord | None) -> WorkerRecord | None:
    """The stored record; None if it is unreadable and ``base`` can stand in for it."""
    try:
        record = WorkerRecord.from_bytes(value)
    except InvalidInputError:
        if base is None:
            raise
        return None
    return record if base is None or record.key == key else None


def _change(before: WorkerRecord, after: WorkerRecord, revision: int) -> UpdateOutcome:
    return UpdateOutcome(before.instance_id, before.key, before.taints, after.taints, revision)
