"""What the operator API does, without gRPC: list and find workers, update taints on one
worker or many, explain a routing decision, and describe the daemon. ``api/service.py``
only converts around these.

Taint updates go through the fleet's write strategy (``boundary.taint_writes``: for
dynamod's own stores ``discovery.updates.update_taints``, compare-and-swap at the read
revision with bounded retries; for an NVIDIA Dynamo fleet each worker's own taint route),
one at a time per worker in this daemon (a lock per worker key), are checked against the
caller's rights on the taints they actually add or remove, and are written to the audit
log, one line per worker. A bulk
update fans out here, and only here: 16 workers at a time, each outcome handed on as soon
as it is known, so a client can show progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from dynamod import __version__
from dynamod.audit import AuditLog, now
from dynamod.auth import Principal
from dynamod.boundary.taint_writes import TaintWrites, writes_for
from dynamod.daemon_metrics import DaemonMetrics
from dynamod.discovery.view import WorkerView
from dynamod.drain_watch import DrainWatch
from dynamod.errors import (
    DynamoError,
    InvalidInputError,
    KeyNotFoundError,
    NotLeaderError,
    PermissionDeniedError,
    RevisionMismatchError,
    StoreUnavailableError,
    UnsupportedError,
)
from dynamod.http.limits import MAX_BODY
from dynamod.load import Busy
from dynamod.open_files import open_count, soft_limit
from dynamod.prompts.body import Tokenized
from dynamod.prompts.reader import PromptReader
from dynamod.records import ModelCard, TaintCheck, WorkerRecord
from dynamod.reports import CandidateInfo, DaemonState, ExplainInfo, StatusInfo
from dynamod.results import (
    ID_PREFIX,
    UpdateFailure,
    UpdateOutcome,
    WorkerInfo,
    WorkerState,
    id_prefix_length,
    own_key,
)
from dynamod.router import Router, RouteRequest, WorkerExplanation
from dynamod.router.explain import by_dynamo_rule, dynamo_summary
from dynamod.router.fit import ANY
from dynamod.selectors import parse
from dynamod.store import Guard, Store, Swap
from dynamod.store.dynamo import DynamoStore
from dynamod.taints import DYNAMO_MAX_WEIGHT, RoutingConstraints, TaintLimits, TaintUpdate
from dynamod.targets import Target
from dynamod.tasks import FAN_OUT, each
from dynamod.tokenizers.bundle import Tokenizers

log = logging.getLogger(__name__)

DEFAULT_BLOCK_SIZE = 16
"""The block size ``explain`` hashes a prompt with when the model has no worker."""
MAX_EXPLAIN_PROMPT = MAX_BODY
"""The longest prompt (characters) ``explain`` tokenizes: no request to the front could
carry a longer one."""

Progress = Callable[[UpdateOutcome], Awaitable[None]]


class BatchItem(NamedTuple):
    """One worker's update in ``Control.update_taints_batch``: at ``expect`` (the revision
    the caller saw), with ``audit`` added to its audit line."""

    record: WorkerRecord
    update: TaintUpdate
    expect: int
    audit: Mapping[str, object]


class KeyedLock:
    """An ``asyncio.Lock`` per key, made on first use and dropped when nobody holds or
    waits for it (a daemon sees workers come and go for months)."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        return len(self._locks)

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


@dataclass
class Control:
    store: Store
    view: WorkerView
    router: Router
    audit: AuditLog
    replica_id: str
    tokenizers: Tokenizers
    """The tokenizers the front uses too: ``explain`` counts and hashes prompts as the
    front would, with the tokenizer the model's workers publish."""
    metrics: DaemonMetrics | None = None
    prompts: PromptReader = field(default_factory=lambda: PromptReader(None))
    """Tokenizes ``explain``'s prompt: a long one in the daemon's prompt processes."""
    limits: TaintLimits = field(default_factory=TaintLimits)
    """How many taints, and bytes of them, an update may leave a worker."""
    started: float = field(default_factory=time.monotonic)
    state: DaemonState = DaemonState.STARTING
    state_store_url: str = ""
    """The state store's URL, for ``status`` ("" until the daemon set it: the store's)."""
    serial: KeyedLock = field(default_factory=KeyedLock)
    """One taint update at a time per worker in this daemon, as Dynamo serialises a
    worker's updates under its metadata lock: concurrent callers queue here instead of
    racing each other's compare-and-swap. Other processes are met by the CAS loop's
    jittered backoff."""
    writes: TaintWrites | None = None
    """How a worker's taints change; by default chosen by the store (``writes_for``)."""

    def __post_init__(self) -> None:
        self._writes = self.writes or writes_for(self.store, self.view)
        self._prefix = (-1, ID_PREFIX)  # (view revision, its id prefix)

    def id_prefix(self) -> int:
        """The shortest id prefix, at least 8 characters, that tells apart every worker the
        view holds: what a listing shows, filtered or not, so that a short id printed
        anywhere resolves with ``get_worker``. Worked out once per view revision."""
        revision, length = self._prefix
        if revision != self.view.revision:
            length = id_prefix_length(r.instance_id for r in self.view.records())
            self._prefix = (self.view.revision, length)
        return length

    def info(self, record: WorkerRecord) -> WorkerInfo:
        key = record.key
        revision = self.view.revision_of(key)
        info = WorkerInfo(record, revision, self.router.load(key), self.router.reported(key))
        if info.state is WorkerState.READY and (why := self.router.disagreement(record)):
            return dataclasses.replace(info, state=WorkerState.EXCLUDED, state_reason=why)
        return info

    def list_workers(
        self,
        *,
        model: str = "",
        selector: str = "",
        namespace: str = "",
        component: str = "",
        endpoint: str = "",
    ) -> tuple[list[WorkerInfo], int]:
        """The workers that match, sorted by key, each with its revision and this router's
        load on it; and the view's revision. An empty filter matches every worker, and
        only the filters given are looked at (a listing of 10,000 workers is one pass)."""
        chosen = parse(selector)
        given = [(k, v) for k, v in (("namespace", namespace), ("component", component),
                                     ("endpoint", endpoint)) if v]  # fmt: skip
        records = self.view.records()
        if model:
            records = [r for r in records if r.model == model]
        if given:
            records = [r for r in records if all(getattr(r, k) == v for k, v in given)]
        if chosen:
            records = [r for r in records if chosen.matches(r)]
        return [self.info(r) for r in records], self.view.revision

    def get_worker(self, ref: str) -> WorkerInfo:
        record = self._find(ref)
        if isinstance(self.store, DynamoStore):
            record = self.store.with_adapters(record)  # a Dynamo worker's LoRA adapters
        return self.info(record)

    def _find(self, ref: str) -> WorkerRecord:
        """``view.find``, taking a Dynamo worker's own key too (the key it is shown by), and
        its id in decimal, as Dynamo's logs and ``nvext.worker_id`` show it."""
        if isinstance(self.store, DynamoStore):
            ref = self.store.view_ref(ref)
        decimal = _from_decimal(ref)
        if decimal is not None:
            with contextlib.suppress(LookupError):
                found = self.view.find(decimal)
                if found.instance_id == decimal:
                    return found
        return self.view.find(ref)

    @property
    def max_weight(self) -> float:
        """The largest preferred-taint weight a request to this fleet may carry (the
        router of an NVIDIA Dynamo fleet takes any 32-bit float)."""
        return DYNAMO_MAX_WEIGHT if isinstance(self.store, DynamoStore) else 1.0

    def targets(self, target: Target) -> list[WorkerRecord]:
        if target.worker is not None:
            return [self._find(target.worker)]
        return [r for r in self.view.records() if target.matcher.matches(r)]

    def watch_drain(self, target: Target, *, after_revision: int = 0) -> DrainWatch:
        """A wait for the ``target``'s workers to drain (``drain_watch.py``), resolved once
        the view holds ``after_revision``. The drain itself is a taint update: the cordon
        and ``dynamo.io/draining`` added together (``update_taints``), so whatever refuses
        a cordon refuses a drain."""
        return DrainWatch(
            self.view, self.router, lambda: self.targets(target), after_revision=after_revision
        )

    async def update_taints(
        self,
        target: Target,
        update: TaintUpdate,
        *,
        caller: Principal,
        dry_run: bool = False,
        progress: Progress | None = None,
        check: TaintCheck | None = None,
        audit: Mapping[str, object] | None = None,
    ) -> list[UpdateOutcome]:
        """Apply ``update`` to every targeted worker; return the outcomes in target order.

        ``progress`` (when given) is awaited with each outcome as soon as it is known. With
        one named worker, its error raises. With a selector or all, 16 workers are updated
        at a time and each failure is reported in its change. Who may write, and which
        workers are meant, is settled before the first worker is touched.

        ``check(before, after)`` runs, beside the caller's rights, right before each write
        (the pool reconciler's leadership fence); ``audit`` adds fields to each worker's
        audit line (its policy and epoch)."""
        try:
            caller.require_write()
            self._writes.admit(update)
        except (PermissionDeniedError, UnsupportedError) as exc:
            self.audit_refused(caller.name, _asked(update, target), exc, peer=caller.peer)
            raise
        records = self.targets(target)
        single = target.worker is not None

        async def one(record: WorkerRecord) -> UpdateOutcome:
            try:
                change = await self._update_one(
                    record, update, caller, target, dry_run, check, audit
                )
            except DynamoError as exc:
                if single:
                    raise
                change = _failed(record, exc)
            if progress is not None:
                await progress(change)
            return change

        if single:
            return [await one(records[0])]
        return await each(records, FAN_OUT, one)

    async def _update_one(
        self,
        record: WorkerRecord,
        update: TaintUpdate,
        caller: Principal,
        target: Target,
        dry_run: bool,
        check: TaintCheck | None = None,
        audit: Mapping[str, object] | None = None,
    ) -> UpdateOutcome:
        if dry_run:
            return self._preview(record, update, caller)
        checked, fields = _checked(caller, check), dict(audit or {})

        def fence(before: WorkerRecord, after: WorkerRecord) -> None:
            checked(before, after)
            fields["sent"] = now()  # what passes here is sent at once (each attempt)

        try:
            async with self.serial.hold(record.key):
                change = await self._writes.apply(
                    record,
                    update,
                    expect_revision=target.expect_revision,
                    check=fence,
                    limits=self.limits,
                    base_revision=self._seen_at(record),
                )
        except DynamoError as exc:
            self._audit(caller, update, record, record.taints, None, None, exc, fields)
            raise
        except asyncio.CancelledError:  # the caller went away (its deadline, Ctrl-C)
            self._audit(caller, update, record, record.taints, None, None, None,
                        fields, cancelled=True)  # fmt: skip
            raise
        self._audit(caller, update, record, change.before, change.after, change.revision, None,
                    fields)  # fmt: skip
        return change

    async def update_taints_batch(
        self,
        items: list[BatchItem],
        *,
        caller: Principal,
        check: TaintCheck,
        guard: Guard | None = None,
    ) -> list[UpdateOutcome | DynamoError | None]:
        """Each item's update in one transaction of the store (``Store.swap_all``), each
        worker at the revision its item expects and the view holds it at, with the lock per
        worker, ``check`` right before the write and one audit line per worker, as
        ``update_taints`` makes them one by one (the pool leader's moves). An outcome per
        item: what changed, its error, or None: write it with ``update_taints`` (the store
        writes one key at a time, the view holds another revision, or the transaction met a
        newer record). With ``guard`` (the pool leader's key) the transaction applies only
        while that key is at its revision: once the term ended, nothing is written, each is
        audited with the ``NotLeaderError``, and it is raised."""
        store = self.store
        if isinstance(store, DynamoStore) or not 0 < len(items) <= store.max_swaps:
            return [None] * len(items)
        results: list[UpdateOutcome | DynamoError | None] = [None] * len(items)
        async with contextlib.AsyncExitStack() as held:
            for key in sorted({item.record.key for item in items}):
                await held.enter_async_context(self.serial.hold(key))
            made: dict[int, WorkerRecord] = {}
            for n, (record, update, expect, audit) in enumerate(items):
                if self.view.get(record.key) is not record or self._seen_at(record) != expect:
                    continue
                try:
                    made[n] = record.updated(update, self.limits)
                    caller.check_taints(_changed(record, made[n]))
                except DynamoError as exc:
                    made.pop(n, None)
                    self._audit(caller, update, record, record.taints, None, None, exc, audit)
                    results[n] = exc
            try:
                for n, after in made.items():
                    check(items[n].record, after)  # the fence, right before the transaction
            except DynamoError as exc:  # the term ended: audited as one by one, then raised
                for n in made:
                    self._batch_audit(caller, items[n], None, None, exc)
                raise
            swaps = [
                Swap(items[n].record.key, a.to_bytes(), items[n].expect) for n, a in made.items()
            ]
            sent = now()
            try:
                revision = await store.swap_all(swaps, guard=guard) if swaps else 0
            except (RevisionMismatchError, KeyNotFoundError):
                return results  # a newer record: each of them one by one
            except NotLeaderError as exc:  # the guard: the term ended, nothing was written
                for n in made:
                    self._batch_audit(caller, items[n], None, None, exc, sent)
                raise
            except DynamoError as exc:
                for n in made:
                    results[n] = self._batch_audit(caller, items[n], None, None, exc, sent)
                return results
            for n, after in made.items():
                results[n] = self._batch_audit(caller, items[n], after, revision, None, sent)
        return results

    def _batch_audit(
        self,
        caller: Principal,
        item: BatchItem,
        after: WorkerRecord | None,
        revision: int | None,
        error: DynamoError | None,
        sent: str | None = None,
    ) -> UpdateOutcome | DynamoError:
        record = item.record
        taints = None if after is None else after.taints
        extra = {**({"sent": sent} if sent else {}), **item.audit}
        self._audit(caller, item.update, record, record.taints, taints, revision, error, extra)
        if error is not None:
            return error
        assert after is not None and revision is not None
        return UpdateOutcome(record.instance_id, record.key, record.taints, after.taints, revision)

    def _seen_at(self, record: WorkerRecord) -> int | None:
        """The revision the view holds ``record`` at, if it still holds this very record."""
        return self.view.revision_of(record.key) if self.view.get(record.key) is record else None

    def _preview(
        self, record: WorkerRecord, update: TaintUpdate, caller: Principal
    ) -> UpdateOutcome:
        after = record.updated(update, self.limits)
        caller.check_taints(_changed(record, after))
        return UpdateOutcome(
            record.instance_id,
            record.key,
            record.taints,
            after.taints,
            self.view.revision_of(record.key),
        )

    def _audit(
        self,
        caller: Principal,
        update: TaintUpdate,
        record: WorkerRecord,
        before: Iterable[str],
        after: Iterable[str] | None,
        revision: int | None,
        error: DynamoError | None,
        extra: Mapping[str, object] | None = None,
        *,
        cancelled: bool = False,
    ) -> None:
        """One worker's audit line. ``cancelled``: the update was cancelled before its
        outcome was known (outcome ``cancelled``; the worker may or may not hold it)."""
        outcome = "ok" if error is None else type(error).__name__
        if error is None and after is not None and tuple(before) == tuple(after):
            outcome = "unchanged"
        if cancelled:
            outcome = "cancelled"
        if self.metrics is not None:
            self.metrics.taint_updates.labels(outcome).inc()
            if outcome == "ok" and revision is not None:
                self.metrics.wrote(record.key, revision)
        self.audit.record(
            source="dynamod",
            caller=caller.name,
            peer=caller.peer,
            action=update.action,
            taints=list(update.taints),
            keys=list(update.keys),
            worker=record.instance_id,
            key=own_key(record),
            before=list(before),
            after=None if after is None else list(after),
            revision=revision,
            outcome=outcome,
            **({"error": str(error)} if error is not None else {}),
            **({"error": _CANCELLED} if cancelled else {}),
            **(extra or {}),
        )

    def audit_refused(
        self, caller: str, asked: Mapping[str, object], error: DynamoError, *, peer: str = ""
    ) -> None:
        """One audit line for a taint update refused as a whole: who (as far as known),
        from where, what was asked, and why (no or a wrong token, no right, invalid input)."""
        if self.metrics is not None:
            self.metrics.taint_updates.labels(type(error).__name__).inc()
        self.audit.record(
            source="dynamod",
            caller=caller,
            peer=peer,
            **asked,
            outcome=type(error).__name__,
            error=str(error),
        )

    async def explain(
        self, model: str, constraints: RoutingConstraints, prompt: str
    ) -> ExplainInfo:
        """The router's decision for a hypothetical request, as data. The prompt is
        tokenized and its blocks hashed as the front would, so prefix overlap shows up
        exactly as a real request would see it."""
        if len(prompt) > MAX_EXPLAIN_PROMPT:
            raise InvalidInputError(
                f"the prompt to explain is {len(prompt)} characters long; at most "
                f"{MAX_EXPLAIN_PROMPT} are allowed (the front's largest body)"
            )
        card = self.router.card(model)
        block_size = card.kv_block_size if card is not None else DEFAULT_BLOCK_SIZE
        read = Tokenized(0, ())
        if prompt:
            tokenizer = await self.tokenizers.for_card(card or ModelCard(model))
            read = await self.prompts.tokenize_text(prompt, tokenizer, block_size)
        # As the front reads it: a worker of another reading is excluded, with the reason.
        reading = self.router.reading(model)
        needs = reading.needs(0) if reading is not None else ANY
        result = self.router.explain(
            RouteRequest(model, constraints, read.prompt_tokens, read.block_hashes, needs=needs)
        )
        if isinstance(self.store, DynamoStore):  # Dynamo's frontend decides, by its rule
            result = by_dynamo_rule(result)
            chosen, summary = dynamo_summary(result)
            return ExplainInfo(tuple(self._candidate(r) for r in result.workers), chosen, summary)
        candidates = tuple(self._candidate(row) for row in result.workers)
        chosen = next((c.worker.id for c in candidates if c.rank == 1), "")
        summary = (
            result.reason or f"would route to {chosen} ({len(candidates)} workers of {model!r})"
        )
        return ExplainInfo(candidates, chosen, summary)

    def _candidate(self, row: WorkerExplanation) -> CandidateInfo:
        terms = row.terms
        info = self.info(row.worker)
        if info.state is WorkerState.EXCLUDED:  # its reading decides, whatever else it lacks
            reason = f"excluded: {info.state_reason}"
        elif row.ineligible is not None:
            reason = row.ineligible.reason(row.worker)
        elif row.busy is Busy.UNHEALTHY and info.engine is not None:
            reason = f"{info.state}: {info.engine.reason}"
        elif row.busy is not None:
            reason = f"busy ({row.busy.value} at capacity)"
        else:
            reason = ""
        return CandidateInfo(
            worker=info,
            eligible=row.eligible,
            reason=reason,
            load_cost=terms.load_cost,
            overlap_credit=terms.overlap_credit,
            overlap_blocks=terms.overlap_blocks,
            preference=terms.preference,
            multiplier=terms.multiplier,
            cost=terms.cost,
            rank=row.rank or 0,
            overlap_source=row.overlap_source,
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
            state_store_url=self.state_store_url or self.store.url,
            open_files=open_count(),
            open_files_limit=min(soft_limit(), 2**31 - 1),
        )


_CANCELLED = (
    "cancelled before its outcome was known (the caller went away, or dynamod stopped); "
    "the worker may or may not hold the change: workers get shows which"
)


def _from_decimal(ref: str) -> str | None:
    """A whole u64 written in decimal (``1353510030897897010``) as the hex id it is; None
    for anything else. A decimal that names no worker's whole id is tried as a prefix of
    a hex id after all, so ``12c8…`` and ``1235…`` keep meaning what they meant."""
    if not (ref.isascii() and ref.isdigit()) or len(ref) > 20:
        return None
    number = int(ref)
    return format(number, "x") if number < 2**64 else None


def _asked(update: TaintUpdate, target: Target) -> dict[str, object]:
    which = target.worker or target.selector or ("all" if target.all else "")
    taints, keys = list(update.taints), list(update.keys)
    return {"action": update.action, "taints": taints, "keys": keys, "target": which}


def _failed(record: WorkerRecord, error: DynamoError) -> UpdateOutcome:
    """One worker's failed part of a bulk update: its taints as they were, and why."""
    failure = UpdateFailure.of(error)
    return UpdateOutcome(record.instance_id, record.key, record.taints, record.taints, 0, failure)


def _changed(before: WorkerRecord, after: WorkerRecord) -> set[str]:
    return set(before.taints) ^ set(after.taints)


def _checked(caller: Principal, check: TaintCheck | None) -> TaintCheck:
    """The check before each write: the caller's rights on the taints changed, then
    ``check`` (when given)."""

    def both(before: WorkerRecord, after: WorkerRecord) -> None:
        caller.check_taints(_changed(before, after))
        if check is not None:
            check(before, after)

    return both
