"""How ``Control`` changes one worker's taints, chosen by where the workers come from.

``writes_for(store, view)`` picks the strategy once, so that every writer of taints —
``dynamoctl taints``, the Python client, a pools reconciler — goes through the same
``Control.update_taints`` (rights, the lock per worker, the audit line) whatever the fleet:

* ``StoreWrites``, for dynamod's own stores: compare-and-swap of the worker record at
  the revision read (``discovery.updates.update_taints``).
* ``RouteWrites``, for an NVIDIA Dynamo fleet (``store.dynamo``): the worker's own route.
  Read the card afresh; compute the whole caller set from it; ``POST`` it to
  ``{system}/engine/update/model_taints`` (``taint_route``); then wait until the store
  shows exactly that set. Dynamo's keys are never written here. Dynamo's route is a
  replace with no compare-and-swap, so this daemon's lock per worker is what keeps
  concurrent updates through it from losing each other; a writer outside it (another
  daemon, a curl to the route) can still interleave, and then the wait ends in a
  ``WorkerUnavailableError`` naming what the store shows.
  The operator's cordon does not carry over: Dynamo's router ignores taints on a request
  that requires none, so a cordon taint would not take the worker out of routing; an
  update that would add one is refused before anything is sent. One set by hand through
  the route (Dynamo takes any string) can be removed (``uncordon``, ``taints rm``): the
  worker's state shows it as not honoured meanwhile (``results.worker_state``).
  Keys in its outcomes and errors are Dynamo's own (the card's, ``v1/mdc/...``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final, Protocol

from dynamod.boundary.taint_route import TIMEOUT, post_taints
from dynamod.discovery.updates import update_taints
from dynamod.discovery.view import WorkerView
from dynamod.errors import (
    RevisionMismatchError,
    UnsupportedError,
    WorkerNotFoundError,
    WorkerUnavailableError,
)
from dynamod.records import TaintCheck, WorkerRecord
from dynamod.results import UpdateOutcome, own_key
from dynamod.store import Store
from dynamod.store.dynamo import DynamoStore
from dynamod.taints import (
    OPERATOR_TAINTS,
    TaintLimits,
    TaintUpdate,
    caller_taints,
    is_topology,
    key_of,
    normalize,
)

SETTLE_WITHIN: Final = 10.0
"""Seconds a route update may take to show in the store before it counts as failed."""


class TaintWrites(Protocol):
    """One worker's taint update, as ``Control`` asks it (``Control`` holds the lock per
    worker and writes the audit line; a strategy only changes the taints)."""

    def admit(self, update: TaintUpdate) -> None:
        """Raise (``UnsupportedError``) for an update this fleet cannot carry out at all,
        before any worker is read."""

    async def apply(
        self,
        record: WorkerRecord,
        update: TaintUpdate,
        *,
        expect_revision: int | None,
        check: TaintCheck,
        limits: TaintLimits,
        base_revision: int | None = None,
    ) -> UpdateOutcome:
        """Apply ``update`` to the worker ``record`` names, computed on its freshly read
        taints; ``check(before, after)`` may refuse it before anything is written;
        ``expect_revision`` fails it (``RevisionMismatchError``) on another revision;
        ``limits`` refuse growth past them; ``base_revision``: the revision ``record`` is
        known to be at (a writer may then skip reading it again). Returns what changed."""


@dataclass(frozen=True)
class StoreWrites:
    """Compare-and-swap in dynamod's own store."""

    store: Store

    def admit(self, update: TaintUpdate) -> None:
        return None

    async def apply(
        self,
        record: WorkerRecord,
        update: TaintUpdate,
        *,
        expect_revision: int | None,
        check: TaintCheck,
        limits: TaintLimits,
        base_revision: int | None = None,
    ) -> UpdateOutcome:
        return await update_taints(
            self.store,
            record.key,
            update,
            expect_revision=expect_revision,
            check=check,
            base=record,
            limits=limits,
            base_revision=base_revision,
        )


@dataclass(frozen=True)
class RouteWrites:
    """Each Dynamo worker's own taint route (see the module docstring)."""

    store: Store
    view: WorkerView
    timeout: float = TIMEOUT
    settle_within: float = SETTLE_WITHIN

    def admit(self, update: TaintUpdate) -> None:
        if update.action not in ("add", "replace"):
            return  # removing one (uncordon, taints rm, clear) is taking it away: allowed
        operators = OPERATOR_TAINTS | {key_of(t) for t in OPERATOR_TAINTS}
        touched = sorted(set(update.taints) & operators)
        if touched:
            raise UnsupportedError(
                f"taint {touched[0]!r} (the cordon) does not carry over to an NVIDIA Dynamo "
                "fleet: Dynamo's router ignores taints on requests that require none, so it "
                "would not take the worker out of routing. Stop the worker, or give it a "
                "taint your requests do not require"
            )

    async def apply(
        self,
        record: WorkerRecord,
        update: TaintUpdate,
        *,
        expect_revision: int | None,
        check: TaintCheck,
        limits: TaintLimits,
        base_revision: int | None = None,
    ) -> UpdateOutcome:
        # A Dynamo worker's card is always read again: its route has no compare-and-swap
        # for a known revision to stand in for.
        fresh, revision = await self._read(record, expect_revision)
        before = caller_taints(fresh.taints)
        after = update.apply(before)
        limits.check(before, after)
        key = own_key(fresh)
        if after == before:
            return UpdateOutcome(fresh.instance_id, key, fresh.taints, fresh.taints, revision)
        wanted = _with_caller(fresh, after)
        check(fresh, wanted)
        await post_taints(
            fresh.system_address, after, worker=fresh.instance_id, within=self.timeout
        )
        shown = await self._settled(fresh, after)
        return UpdateOutcome(
            fresh.instance_id, key, fresh.taints, wanted.taints, self.view.revision_of(shown)
        )

    async def _read(self, record: WorkerRecord, expect: int | None) -> tuple[WorkerRecord, int]:
        entry = await self.store.get(record.key)
        if entry is None:
            key = own_key(record)
            raise WorkerNotFoundError(key, f"no Dynamo worker is registered at {key!r}")
        fresh = WorkerRecord.from_bytes(entry.value)
        if expect is not None and entry.revision != expect:
            raise RevisionMismatchError(own_key(fresh), expect, entry.revision)
        return fresh, entry.revision

    async def _settled(self, worker: WorkerRecord, wanted: tuple[str, ...]) -> str:
        """Wait until the view (the store, as watched) shows exactly ``wanted``."""
        key = worker.key

        def shows(view: WorkerView) -> bool:
            found = view.get(key)
            return found is not None and caller_taints(found.taints) == wanted

        try:
            await self.view.wait_for(shows, within=self.settle_within)
        except TimeoutError:
            found = self.view.get(key)
            now = "no such worker" if found is None else list(caller_taints(found.taints))
            raise WorkerUnavailableError(
                worker.instance_id,
                f"worker {worker.instance_id} accepted taints {list(wanted)}, but after "
                f"{self.settle_within:g} s the store shows {now}: another writer may have "
                "changed them, or the worker did not store them; retry to set them again",
            ) from None
        return key


def writes_for(store: Store, view: WorkerView) -> TaintWrites:
    """The strategy for the fleet ``store`` reads."""
    if isinstance(store, DynamoStore):
        return RouteWrites(store, view)
    return StoreWrites(store)


def _with_caller(record: WorkerRecord, caller: tuple[str, ...]) -> WorkerRecord:
    """``record`` holding ``caller`` beside the generated taints it holds. Unlike
    ``WorkerRecord.with_caller_taints`` this checks nothing: a Dynamo worker may hold taints
    dynamod's grammar refuses (Dynamo accepts any string), and they travel on as they are;
    the update's own taints were checked when it was built."""
    generated = tuple(t for t in record.taints if is_topology(t))
    config = replace(record.runtime_config, taints=normalize((*caller, *generated)))
    return replace(record, runtime_config=config)
