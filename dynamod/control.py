"""What the operator API does, without gRPC: list and find workers, change taints on one
worker or many, and describe the daemon. ``api/service.py`` only converts around these.

Taint changes go through ``discovery.registry.update_taints`` (compare-and-swap at the read
revision, bounded retries), are checked against the caller's rights on the taints they
actually add or remove, and are written to the audit log, one line per worker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from dynamod import __version__
from dynamod.api.types import Failure, Load, StatusInfo, TaintChange, WorkerInfo
from dynamod.audit import AuditLog
from dynamod.auth import Principal
from dynamod.discovery.registry import TaintOp, update_taints
from dynamod.discovery.view import WorkerView
from dynamod.errors import DynamoError, InvalidInputError, StoreUnavailableError
from dynamod.metrics import DaemonMetrics
from dynamod.model import WorkerRecord
from dynamod.router import Router
from dynamod.selectors import Selector, parse
from dynamod.status import code_name
from dynamod.store import Store
from dynamod.taints import apply_caller_taints, caller_taints

log = logging.getLogger(__name__)

BULK_CONCURRENCY = 16


@dataclass(frozen=True)
class Target:
    """Which workers an operation is for: one (id, key or unique prefix), those a
    selector matches, or all of them."""

    worker: str | None = None
    selector: str | None = None
    all: bool = False

    def __post_init__(self) -> None:
        if [self.worker is not None, self.selector is not None, self.all].count(True) != 1:
            raise InvalidInputError("name exactly one target: a worker id, a selector, or all")


@dataclass
class Control:
    store: Store
    view: WorkerView
    router: Router
    audit: AuditLog
    replica_id: str
    metrics: DaemonMetrics | None = None
    started: float = field(default_factory=time.monotonic)
    state: str = "starting"

    def info(self, record: WorkerRecord) -> WorkerInfo:
        load = self.router.load(record.key)
        return WorkerInfo(
            record,
            self.view.revision_of(record.key),
            Load(load.active_requests, load.prefill_tokens, load.kv_blocks),
        )

    def list_workers(
        self,
        *,
        model: str = "",
        selector: str = "",
        namespace: str = "",
        component: str = "",
        endpoint: str = "",
    ) -> tuple[list[WorkerInfo], int]:
        chosen = parse(selector)
        fields = {"namespace": namespace, "component": component, "endpoint": endpoint}
        records = [
            r
            for r in self.view.records()
            if (not model or r.model == model)
            and all(not v or getattr(r, k) == v for k, v in fields.items())
            and chosen.matches(r)
        ]
        return [self.info(r) for r in records], self.view.revision

    def get_worker(self, ref: str) -> WorkerInfo:
        return self.info(self.view.find(ref))

    def targets(self, target: Target) -> list[WorkerRecord]:
        if target.worker is not None:
            return [self.view.find(target.worker)]
        selector = parse(target.selector or "") if target.selector is not None else Selector()
        return [r for r in self.view.records() if selector.matches(r)]

    async def update_taints(
        self,
        target: Target,
        op: TaintOp,
        *,
        caller: Principal,
        expect_revision: int | None = None,
        dry_run: bool = False,
    ) -> list[TaintChange]:
        """Apply ``op`` to every targeted worker. With one named worker, errors raise;
        with a selector or all, each worker's failure is reported in its change."""
        if expect_revision is not None and target.worker is None:
            raise InvalidInputError("an expected revision needs a single worker, not a selector")
        caller.require_write()
        records = self.targets(target)
        single = target.worker is not None
        gate = asyncio.Semaphore(BULK_CONCURRENCY)

        async def one(record: WorkerRecord) -> TaintChange:
            async with gate:
                return await self._update_one(record, op, caller, expect_revision, dry_run, single)

        return list(await asyncio.gather(*(one(r) for r in records)))

    async def _update_one(
        self,
        record: WorkerRecord,
        op: TaintOp,
        caller: Principal,
        expect_revision: int | None,
        dry_run: bool,
        single: bool,
    ) -> TaintChange:
        try:
            if dry_run:
                return self._preview(record, op, caller)
            result = await update_taints(
                self.store,
                record.key,
                op,
                expect_revision=expect_revision,
                check=lambda before, after: caller.check_taints(_changed(before, after)),
            )
        except DynamoError as exc:
            if not dry_run:
                self._audit(caller, op, record, record.taints, None, None, exc)
            if single:
                raise
            return TaintChange(
                record.instance_id, record.key, record.taints, record.taints, 0,
                Failure(code_name(exc), str(exc)),
            )  # fmt: skip
        change = TaintChange(
            record.instance_id,
            record.key,
            result.before.taints,
            result.after.taints,
            result.revision,
        )
        self._audit(caller, op, record, change.before, change.after, change.revision, None)
        return change

    def _preview(self, record: WorkerRecord, op: TaintOp, caller: Principal) -> TaintChange:
        after = apply_caller_taints(record, op.apply(caller_taints(record.taints)))
        caller.check_taints(_changed(record, after))
        return TaintChange(
            record.instance_id,
            record.key,
            record.taints,
            after.taints,
            self.view.revision_of(record.key),
        )

    def _audit(
        self,
        caller: Principal,
        op: TaintOp,
        record: WorkerRecord,
        before: Iterable[str],
        after: Iterable[str] | None,
        revision: int | None,
        error: DynamoError | None,
    ) -> None:
        outcome = "ok" if error is None else type(error).__name__
        if error is None and after is not None and tuple(before) == tuple(after):
            outcome = "unchanged"
        if self.metrics is not None:
            self.metrics.taint_updates.labels(outcome).inc()
            if outcome == "ok" and revision is not None:
                self.metrics.wrote(record.key, revision)
        self.audit.record(
            caller=caller.name,
            operation=op.kind,
            taints=list(op.taints),
            keys=list(op.keys),
            worker=record.instance_id,
            key=record.key,
            before=list(before),
            after=None if after is None else list(after),
            revision=revision,
            outcome=outcome,
            **({"error": str(error)} if error is not None else {}),
        )

    async def status(self, version: str = __version__) -> StatusInfo:
        healthy, problem = True, ""
        try:
            async with asyncio.timeout(2.0):
                await self.store.get("v1/health")
        except (StoreUnavailableError, TimeoutError) as exc:
            healthy, problem = False, str(exc) or "no answer within 2 s"
        return StatusInfo(
            version=version,
            store_url=self.store.url,
            store_healthy=healthy,
            store_error=problem,
            workers=len(self.view),
            uptime_seconds=time.monotonic() - self.started,
            replica_id=self.replica_id,
            queue_depth=self.router.queue_depth,
            revision=self.view.revision,
            state=self.state,
        )


def _changed(before: WorkerRecord, after: WorkerRecord) -> set[str]:
    return set(before.taints) ^ set(after.taints)
