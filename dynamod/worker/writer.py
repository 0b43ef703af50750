"""This worker's own taint updates: Dynamo's ``update_model_taints`` for the system route and
for code running inside the worker.

``WorkerTaintWriter`` is the one writer of this worker's taints in its process. Every update —
the route's and the in-process API's (``runtime.update_model_taints``) — runs under one
lock, so concurrent callers queue instead of racing each other's compare-and-swap (Dynamo
serialises a worker's updates under its metadata lock); writers in other processes are met
by the compare-and-swap loop's jittered backoff. Each update is computed on the worker's
own registered record, so a record changed out of band is written back rather than
reported as updated while routers ignore it (``update_taints``'s ``base``), and is first
tried at the revision the registration last followed, without a read: one store round trip
where the worker's record has not changed since (``update_taints``'s ``base_revision``).

Every update, and every refused attempt, leaves one audit line (``dynamod.audit``): where it
came from (``source``: ``worker-route`` or ``worker``; ``peer``: the client's address, or
``in-process``), the token's name as ``caller`` when a token was presented, the taints
sent, the complete taint sets before and after, the revision, and the outcome.

The operator's taints (``OPERATOR_TAINTS``: the cordon) are outside a worker's reach: its
updates keep them as they are (a replace that leaves the cordon out keeps it), and one that
would add them is refused with 403 (``TaintUpdate.keeping``). Only dynamod, through
``dynamoctl``, cordons and uncordons.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from dynamod.audit import AuditLog
from dynamod.auth import Principal
from dynamod.discovery.registration import Registration
from dynamod.discovery.updates import update_taints
from dynamod.errors import DynamoError, ShuttingDownError
from dynamod.records import TaintCheck, WorkerRecord
from dynamod.results import UpdateOutcome
from dynamod.taints import OPERATOR_TAINTS, TaintLimits, TaintUpdate

State = Literal["starting", "running", "shutting down"]
IN_PROCESS = "in-process"


class WorkerTaintWriter:
    """See the module docstring. ``state`` follows the worker's life; updates are taken
    only while it is ``running``."""

    def __init__(self, audit: AuditLog, limits: TaintLimits | None = None) -> None:
        self.audit = audit
        self.limits = limits or TaintLimits()
        self.state: State = "starting"
        self.registration: Registration | None = None
        self._lock = asyncio.Lock()
        self._settled = asyncio.Event()  # set once running or shutting down

    def running(self, registration: Registration) -> None:
        self.registration = registration
        self.state = "running"
        self._settled.set()

    def shutting_down(self) -> None:
        self.state = "shutting down"
        self._settled.set()

    async def apply(
        self,
        update: TaintUpdate,
        *,
        peer: str,
        caller: Principal | None = None,
        wait: bool = False,
    ) -> UpdateOutcome:
        """Apply ``update`` to this worker's record; return what changed.

        Raises ``ShuttingDownError`` unless the worker is running (``wait``: wait while it
        is starting), ``PermissionDeniedError`` when ``caller`` may not change those
        taints, ``ConflictError`` when every compare-and-swap attempt lost to writers in
        other processes, ``StoreUnavailableError`` / ``WorkerNotFoundError`` when the store
        or the record is gone."""
        try:
            registration = await self._registration(wait)
            async with self._lock:
                change = await update_taints(
                    registration.store,
                    registration.record.key,
                    update.keeping(OPERATOR_TAINTS),
                    check=None if caller is None else _check(caller),
                    base=registration.record,
                    limits=self.limits,
                    base_revision=registration.revision,
                )
        except DynamoError as exc:
            self.refused(update, peer=peer, caller=caller, error=exc)
            raise
        self._record(update, peer, caller, change, "ok" if change.changed else "unchanged")
        return change

    async def _registration(self, wait: bool) -> Registration:
        if wait:
            await self._settled.wait()
        if self.registration is None or self.state != "running":
            raise ShuttingDownError(
                f"engine administrative routes are unavailable while the worker is {self.state}"
            )
        return self.registration

    def refused(
        self,
        update: TaintUpdate | None,
        *,
        peer: str,
        caller: Principal | None,
        error: DynamoError,
    ) -> None:
        """The audit line of an attempt that changed nothing: the error's class as the
        outcome (as dynamod's audit lines have it) and its message."""
        record = self.registration.record if self.registration is not None else None
        self.audit.record(
            **_who(peer, caller),
            action=None if update is None else update.action,
            taints=None if update is None else list(update.taints),
            worker=None if record is None else record.instance_id,
            key=None if record is None else record.key,
            before=None if record is None else list(record.taints),
            after=None,
            revision=None,
            outcome=type(error).__name__,
            error=str(error),
        )

    def _record(
        self,
        update: TaintUpdate,
        peer: str,
        caller: Principal | None,
        change: UpdateOutcome,
        outcome: str,
    ) -> None:
        self.audit.record(
            **_who(peer, caller),
            action=update.action,
            taints=list(update.taints),
            worker=change.worker,
            key=change.key,
            before=list(change.before),
            after=list(change.after),
            revision=change.revision,
            outcome=outcome,
        )


def _who(peer: str, caller: Principal | None) -> dict[str, str | None]:
    return {
        "source": "worker" if peer == IN_PROCESS else "worker-route",
        "peer": peer,
        "caller": None if caller is None else caller.name,
    }


def _check(caller: Principal) -> TaintCheck:
    def check(before: WorkerRecord, after: WorkerRecord) -> None:
        caller.check_taints(set(before.taints) ^ set(after.taints))

    return check
