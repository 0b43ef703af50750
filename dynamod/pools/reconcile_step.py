"""One policy's reconcile step, as the leader runs it: observe, plan, write, requeue.

``owned`` is the observed state of a policy's workers (a read: it never changes anything);
``Leading.step`` compares it with the desired state (the policy, through ``plan.plan``),
reports drift, writes the moves due now and returns when it wants to run again (a budget
refill, a failed move's next attempt, or at once after moves, so the gauges and the next
moves see them). ``reconciler.PoolReconciler`` calls it for each policy in force at every
change and at the time it asks for.

Each write is a replace of the worker's caller taints with the policy's pool taints (and
its retired ones) swapped for the new pool, at the revision the plan saw (a newer record
fails it, and the newer record's event brings another round), with a ``check`` that calls
the term's ``fence()`` right before the compare-and-swap, and the policy, the move and the
epoch in the audit line. Where the store has transactions (``Store.max_swaps``) every
write, a single one too, goes through the ``BatchWriter`` (``Control.update_taints_batch``)
guarded by the leader key (``Leadership.guard``): the store refuses it once the term
ended. Elsewhere, and for a write the batch hands back (the view holds a newer record),
the ``TaintWriter`` (``Control.update_taints``) writes it, fenced by time only.
Before a batch is sent its intent is in the policy's history (``intents.py``), so a leader
killed between the store's commit and its log leaves the next leader what to log.
A move that fails is held back per worker (``move_failures``): the back-off, or, refused,
until something changes. A move whose outcome is unknown forgets what was assigned to that
worker, so the next round reads the truth from the store instead of taking its own write
for drift.

The leader's own writes not yet seen by the view are one map, record key -> the revision
written (``Leading.own``): the view's event for that revision is no news, and until it
comes the worker holds, for the plan, the pool the write set.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, NamedTuple, Protocol

from dynamod.audit import AuditLog
from dynamod.discovery.view import WorkerView
from dynamod.errors import DynamoError, NotLeaderError, RevisionMismatchError, WorkerNotFoundError
from dynamod.pool_results import DriftSeen, PoolMove
from dynamod.pools.demand import DEMAND_EVERY, Demand
from dynamod.pools.elastic import Window
from dynamod.pools.history import FLUSH_EVERY, HistoryWriter
from dynamod.pools.intents import Intended, Intent
from dynamod.pools.leader import Leadership
from dynamod.pools.move_budget import MoveBudget
from dynamod.pools.move_failures import Basis, MoveFailures
from dynamod.pools.owners import Owners
from dynamod.pools.plan import ElasticInput, OwnedWorker, Plan, held_pools, plan
from dynamod.pools.policy import PoolPolicy
from dynamod.pools.pool_metrics import PoolMetrics
from dynamod.pools.reconciled import Settling, settle_into
from dynamod.pools.stored import StoredPolicy
from dynamod.records import WorkerRecord
from dynamod.results import UpdateOutcome
from dynamod.store import Guard, Store
from dynamod.taints import OPERATOR_TAINTS, TaintUpdate, caller_taints
from dynamod.tasks import FAN_OUT, each

log = logging.getLogger(__name__)

BATCH: Final = 64
"""Moves in one transaction, where the store has them (``Store.swap_all``: etcd)."""
BATCHES: Final = 4
"""Transactions in flight at once."""
LOG_EACH: Final = 16
"""A round of at most this many writes logs each move; a larger one logs one line (each
move is in the audit log, and a 10,000-worker apply is not 10,000 log lines)."""

Check = Callable[[WorkerRecord, WorkerRecord], None]


class TaintWriter(Protocol):
    """One worker's taint update as the leader makes it: ``Control.update_taints`` for that
    worker, with ``expect_revision``, ``check`` run right before the write, and ``audit``
    added to the audit line. The daemon wires it; tests may write the store directly."""

    def __call__(
        self,
        record: WorkerRecord,
        update: TaintUpdate,
        *,
        expect_revision: int,
        check: Check,
        audit: Mapping[str, object],
    ) -> Awaitable[UpdateOutcome]: ...


class Write(NamedTuple):
    """One worker's write in a ``BatchWriter``'s batch (``TaintWriter``'s arguments)."""

    record: WorkerRecord
    update: TaintUpdate
    expect_revision: int
    audit: Mapping[str, object]


class BatchWriter(Protocol):
    """Many workers' writes in one store transaction (``Control.update_taints_batch``),
    each fenced by ``check`` and audited: per write, what changed, its error, or None:
    write that one with the ``TaintWriter`` (a store that writes one key at a time, or a
    newer record)."""

    def __call__(
        self, writes: list[Write], *, check: Check, guard: Guard | None
    ) -> Awaitable[list[UpdateOutcome | DynamoError | None]]: ...


class Step(NamedTuple):
    """One write of a round: a plan's ``Move``, or ``why="retired"``: a replaced version's
    pool taint stripped from a worker that keeps its pool."""

    worker: str
    from_pool: str | None
    to_pool: str
    why: str


class Owned(NamedTuple):
    """An owned worker's record and the revision the plan saw it at."""

    record: WorkerRecord
    revision: int


class Observed(NamedTuple):
    """What the daemon knows of a worker beside its record. ``in_flight`` is the engine's
    own count (``engine``: every request on the worker, whichever daemon routed it) where
    the engine reports one, else this daemon's router's."""

    healthy: bool = True
    in_flight: int = 0
    cached_blocks: int = 0
    engine: bool = False


def nothing_observed(key: str) -> Observed:
    return Observed()


@dataclass
class PolicyTerm:
    """A leader's memory of one policy during its term."""

    history: HistoryWriter
    budget: MoveBudget
    assigned: dict[str, str] = field(default_factory=dict)
    """Worker -> the pool the leader last set or confirmed on it in this term."""
    reported: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Drift already reported: worker -> the pool taints it held then."""

    @property
    def window(self) -> Window:
        """An elastic policy's hysteresis window: kept in the history, so a new leader
        carries it on."""
        return self.history.window


class LeaderTerm:
    """One term as leader: its fence, each policy's memory, the failed moves."""

    def __init__(self, leadership: Leadership) -> None:
        self.leadership = leadership
        self.policies: dict[str, PolicyTerm] = {}
        self.failures = MoveFailures()
        self.wake_at: float | None = None
        """Loop time of the next round without a change: what the steps asked for."""

    @property
    def epoch(self) -> int:
        return self.leadership.epoch

    def fence(self) -> int:
        return self.leadership.fence()

    def check(self, before: WorkerRecord, after: WorkerRecord) -> None:
        """The ``check`` of each write: the fence, right before the compare-and-swap."""
        self.leadership.fence()

    def wake(self, at: float | None) -> None:
        if at is not None:
            self.wake_at = at if self.wake_at is None else min(self.wake_at, at)


def owned(
    workers: WorkerView,
    owners: Owners,
    observe: Callable[[str], Observed],
    policy: PoolPolicy,
    assigned: Mapping[str, str],
    own: Mapping[str, int],
    routed: Mapping[str, int] | None = None,
) -> tuple[list[OwnedWorker], dict[str, Owned]]:
    """The workers ``policy`` owns now, as the plan sees them, and their records (with the
    revision seen) by id. A worker whose record the view has not yet seen at the revision
    of the leader's own last write to it (``own``) holds, for the plan, the pool that write
    set (``assigned``). ``routed``: every daemon's requests in flight by worker key
    (``demand.Snapshot.routed``), the in flight of a worker whose engine reports none.
    ``owners`` finds the policy's records without a scan of the fleet. A read: nothing is
    changed."""
    found: list[OwnedWorker] = []
    records: dict[str, Owned] = {}
    for record in owners.of(policy.match):
        seen = observe(record.key)
        routable = seen.healthy and not OPERATOR_TAINTS.intersection(record.taints)
        domain = None
        if policy.spread_by is not None:
            domain = record.runtime_config.topology_domains.get(policy.spread_by)
        revision = workers.revision_of(record.key)
        held = held_pools(record.taints, policy)
        written = own.get(record.key)
        if written is not None and revision < written and record.instance_id in assigned:
            held = (assigned[record.instance_id],)
        in_flight = seen.in_flight
        if routed is not None and not seen.engine:
            in_flight = routed.get(record.key, 0)
        worker = OwnedWorker(
            record.instance_id, held, in_flight, seen.cached_blocks, domain, routable
        )
        found.append(worker)
        records[record.instance_id] = Owned(record, revision)
    return found, records


class Leading:
    """What a leader's steps share: the store, the view, the writer, the own-write map."""

    def __init__(
        self,
        store: Store,
        workers: WorkerView,
        writer: TaintWriter,
        identity: str,
        observe: Callable[[str], Observed],
        metrics: PoolMetrics,
        demand: Demand,
        batch: BatchWriter | None = None,
        audit: AuditLog | None = None,
    ) -> None:
        self.store = store
        self.audit = audit
        """Where settled intents' moves are audited (``reconciled.py``; None: the log only)."""
        self.demand = demand
        self.workers = workers
        self.owners = Owners(workers)
        """The workers each policy selects, indexed (no scan of the fleet per policy)."""
        self.writer = writer
        self.batch = batch
        self.identity = identity
        self.observe = observe
        self.metrics = metrics
        self.own: dict[str, int] = {}
        """Record key -> the revision of the leader's own write the view has not shown."""
        self.settings = 0
        """The daemon's settings generation (a reload counts up): refused moves try again."""
        self.log_each = True
        """Whether the writes in progress log each move (``LOG_EACH``)."""
        self.fenced = batch is not None and store.max_swaps > 0
        """Whether every move is a ``swap_all`` guarded by the leader key (a single move
        too): the store fences a deposed leader's late write (``leader.py``)."""

    def settling(self, term: LeaderTerm, policy: PoolPolicy) -> Settling:
        """How this leader settles intents of ``policy`` (``reconciled.settle_into``)."""
        return Settling(self.workers, policy.name, self.identity, term.epoch, self.audit)

    def seen(self, key: str, revision: int) -> bool:
        """The view shows ``key`` at ``revision``: True when that is the leader's own write
        (no news for the plan)."""
        written = self.own.get(key)
        if written is None or revision < written:
            return False
        del self.own[key]
        return revision == written

    def plan_of(
        self, policy: PoolPolicy, assigned: Mapping[str, str] | None, window: Window
    ) -> tuple[Plan, list[OwnedWorker], dict[str, Owned]]:
        """The plan of ``policy`` from the observed state now, and what it was made of: the
        owned workers and their records. An elastic policy's counts follow every daemon's
        demand now (``demand.Demand``), settled by ``window``. A read."""
        routed, load = None, None
        if policy.elastic is not None:
            snapshot = self.demand.snapshot()
            routed = snapshot.routed
            load = ElasticInput(snapshot.waiting(policy.pools), window, time.time())
        workers, records = owned(
            self.workers, self.owners, self.observe, policy, assigned or {}, self.own, routed
        )
        return plan(policy, workers, assigned=assigned, load=load), workers, records

    async def step(
        self, term: LeaderTerm, stored: StoredPolicy, memory: PolicyTerm
    ) -> float | None:
        """Reconcile one policy once; the loop time it wants to run again (None: at the
        next change; an elastic policy at least every ``DEMAND_EVERY``)."""
        policy = stored.policy
        result, workers, records = self.plan_of(policy, memory.assigned, memory.window)
        if result.window is not None:
            memory.history.keep_window(result.window)
        for key in [k for k, r in self.own.items() if self.workers.revision_of(k) >= r]:
            del self.own[key]
        for gone in set(memory.assigned) - set(records):
            del memory.assigned[gone]
        term.failures.keep_only(policy.name, set(records))
        self.metrics.planned(result)
        self._note_drift(stored, result, records, memory)
        loop = asyncio.get_running_loop()
        now = loop.time()
        paced = now + DEMAND_EVERY if policy.elastic is not None else None
        if policy.paused:
            return paced

        def basis(worker: str) -> Basis:
            return Basis(stored.revision, records[worker].revision, self.settings)

        ready = [m for m in result.moves if not term.failures.holds(m.worker, basis(m.worker), now)]
        allowed = memory.budget.allowed(now)
        steps = [Step(*m) for m in (ready if allowed is None else ready[:allowed])]
        wake = term.failures.due()
        if len(steps) < len(ready):
            wake = _earliest(wake, memory.budget.refills_at(now))
        planned = {m.worker for m in result.moves}
        strips = _strips(stored, workers, records, planned)
        steps += [s for s in strips if not term.failures.holds(s.worker, basis(s.worker), now)]
        _adopt(memory.assigned, workers, result, planned)
        moved = await self._write_all(term, stored, memory, steps, records)
        if moved:
            return loop.time()  # plan again once: the gauges and the next moves see these
        return _earliest(_earliest(wake, term.failures.due()), paced)

    def _note_drift(
        self,
        stored: StoredPolicy,
        result: Plan,
        records: Mapping[str, Owned],
        memory: PolicyTerm,
    ) -> None:
        policy = stored.policy
        drifted = set(result.drift)
        for worker in result.drift:
            record, revision = records[worker]
            held = held_pools(record.taints, policy)
            if memory.reported.get(worker) == held:
                continue
            memory.reported[worker] = held
            action = _drift_action(policy, worker in result.excluded)
            seen = DriftSeen(worker, held, memory.assigned[worker], revision, time.time(), action)
            memory.history.add(seen)
            self.metrics.drift.labels(policy.name).inc()
            log.warning(
                "pool policy %s: worker %s holds %s instead of %s, changed by another writer "
                "(revision %d); %s",
                policy.name, worker, ",".join(held) or "no pool", seen.assigned,
                seen.revision, action,
            )  # fmt: skip
        for worker in set(memory.reported) - drifted:
            del memory.reported[worker]

    async def _write_all(
        self,
        term: LeaderTerm,
        stored: StoredPolicy,
        memory: PolicyTerm,
        steps: list[Step],
        records: Mapping[str, Owned],
    ) -> int:
        """Write ``steps``: ``BATCH`` to a transaction, ``BATCHES`` at a time, where the
        writer batches, else ``BATCH`` at a time, ``FAN_OUT`` of them one by one at once;
        how many committed. Each batch's intent is in the history before it is sent
        (``intents.py``), written with the next ``BATCHES - 1`` batches' (one history write
        per ``BATCHES`` batches); a batch whose intent cannot be written is not sent."""
        stale = memory.history.take_pending()  # a failed round's batches: outcome unknown
        settle_into(memory.history, stale, self.settling(term, stored.policy))
        self.log_each = len(steps) <= LOG_EACH
        width = BATCHES if self.batch is not None and (len(steps) > 1 or self.fenced) else 1
        batches = [steps[i : i + BATCH] for i in range(0, len(steps), BATCH)]
        intents: list[Intent] = []

        async def write(index: int) -> int:
            batch = batches[index]
            if index == len(intents):  # the slots take the batches in order
                ahead = [self._intent(term, b, records) for b in batches[index : index + BATCHES]]
                intents.extend(ahead)
                memory.history.announce(ahead)
            intent = intents[index]
            if not await memory.history.intend(self.store, term.fence, intent):
                return 0
            done = await self._write(term, stored, memory, batch, records)
            memory.history.done(intent)  # not on a raise: the next leader settles it
            if len(memory.history.unwritten) >= FLUSH_EVERY:
                await memory.history.flush(self.store, term.fence)
            return done

        moved = sum(await each(range(len(batches)), width, write))
        if moved and len(steps) > LOG_EACH:
            log.info(
                "pool policy %s: %d of %d workers moved (epoch %d; each in the audit log), "
                "from %s", stored.name, moved, len(steps), term.epoch, steps[0].worker,
            )  # fmt: skip
        return moved

    async def _write(
        self,
        term: LeaderTerm,
        stored: StoredPolicy,
        memory: PolicyTerm,
        batch: list[Step],
        records: Mapping[str, Owned],
    ) -> int:
        """One batch of steps (the ``TaintWriter``, ``FAN_OUT`` at once, where the store has
        no transactions, and for one step unless the store fences it: a batch of one); how
        many committed."""
        if self.batch is None or (len(batch) == 1 and not self.fenced):

            async def one(step: Step) -> bool:
                return await self._move(term, stored, memory, step, records[step.worker])

            return sum(await each(batch, FAN_OUT, one))
        writes = [self._write_of(term, stored, step, records[step.worker]) for step in batch]
        try:
            results = await self.batch(writes, check=term.check, guard=term.leadership.guard)
        except NotLeaderError as exc:  # the store refused the guard: the term has ended
            term.leadership.depose(str(exc))
            raise
        moved = 0
        for step, result in zip(batch, results, strict=True):
            owned = records[step.worker]
            if result is None:
                moved += await self._move(term, stored, memory, step, owned)
            elif isinstance(result, DynamoError):
                self._failed(term, stored, step, owned, result)
                memory.assigned.pop(step.worker, None)
            else:
                self._committed(term, stored.policy, memory, step, owned, result)
                moved += 1
        return moved

    def _intent(self, term: LeaderTerm, batch: list[Step], records: Mapping[str, Owned]) -> Intent:
        moves = tuple(
            Intended(s.worker, records[s.worker].record.key, s.from_pool or "", s.to_pool, s.why,
                     records[s.worker].revision)
            for s in batch
        )  # fmt: skip
        return Intent(time.time(), term.epoch, self.identity, moves)

    def _write_of(self, term: LeaderTerm, stored: StoredPolicy, move: Step, owned: Owned) -> Write:
        policy = stored.policy
        record = owned.record
        keep = set(caller_taints(record.taints)) - policy.taints - stored.retired
        update = TaintUpdate.replace(sorted(keep | {move.to_pool}))
        audit = {
            "pool_policy": policy.name,
            "epoch": term.epoch,
            "leader": self.identity,
            "move": {"from": move.from_pool, "to": move.to_pool, "why": move.why},
        }
        return Write(record, update, owned.revision, audit)

    async def _move(
        self, term: LeaderTerm, stored: StoredPolicy, memory: PolicyTerm, move: Step, owned: Owned
    ) -> bool:
        write = self._write_of(term, stored, move, owned)
        try:
            outcome = await self.writer(
                write.record, write.update, expect_revision=write.expect_revision,
                check=term.check, audit=write.audit,
            )  # fmt: skip
        except NotLeaderError:
            raise
        except (RevisionMismatchError, WorkerNotFoundError) as exc:
            log.debug("pool move of %s skipped, its record changed: %s", move.worker, exc)
            return False
        except DynamoError as exc:
            self._failed(term, stored, move, owned, exc)
            memory.assigned.pop(move.worker, None)
            return False
        self._committed(term, stored.policy, memory, move, owned, outcome)
        return True

    def _committed(
        self,
        term: LeaderTerm,
        policy: PoolPolicy,
        memory: PolicyTerm,
        move: Step,
        owned: Owned,
        outcome: UpdateOutcome,
    ) -> None:
        key = owned.record.key
        if self.workers.revision_of(key) < outcome.revision:
            self.own[key] = outcome.revision
        self._moved(term, policy, memory, move, outcome)

    def _moved(
        self,
        term: LeaderTerm,
        policy: PoolPolicy,
        memory: PolicyTerm,
        move: Step,
        outcome: UpdateOutcome,
    ) -> None:
        memory.assigned[move.worker] = move.to_pool
        memory.reported.pop(move.worker, None)
        term.failures.succeeded(move.worker)
        if move.why != "retired":
            memory.budget.spend(asyncio.get_running_loop().time())
        made = PoolMove(
            move.worker, move.from_pool or "", move.to_pool, move.why, time.time(), term.epoch,
            outcome.revision, self.identity,
        )  # fmt: skip
        memory.history.add(made)
        self.metrics.moves.labels(policy.name, move.why).inc()
        log.log(
            logging.INFO if self.log_each else logging.DEBUG,
            "pool policy %s: worker %s %s -> %s (%s; epoch %d, revision %d)",
            policy.name, move.worker, move.from_pool or "no pool", move.to_pool, move.why,
            term.epoch, outcome.revision,
        )  # fmt: skip

    def _failed(
        self, term: LeaderTerm, stored: StoredPolicy, move: Step, owned: Owned, exc: DynamoError
    ) -> None:
        policy = stored.policy
        self.metrics.failures.labels(policy.name, type(exc).__name__).inc()
        basis = Basis(stored.revision, owned.revision, self.settings)
        loop = asyncio.get_running_loop()
        due = term.failures.failed(
            move.worker, policy.name, move.to_pool, exc, basis, now=loop.time(), wall=time.time()
        )
        when = (
            "not again until the policy, the worker or the daemon's settings change"
            if due is None
            else f"trying again in {due - loop.time():.0f} s"
        )
        log.warning(
            "pool policy %s: moving worker %s to %s failed (%s); %s",
            policy.name, move.worker, move.to_pool, exc, when,
        )  # fmt: skip


def _earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def _drift_action(policy: PoolPolicy, excluded: bool) -> str:
    if policy.paused:
        return "left as it is: the policy is paused"
    if excluded:
        return "left as it is: the worker is not routable"
    return "put back"


def _adopt(
    assigned: dict[str, str], workers: list[OwnedWorker], result: Plan, planned: set[str]
) -> None:
    """Routable workers holding one pool, not drifted, not about to move: what they hold is
    what the leader stands by (``assigned``), unless it assigned them something already."""
    drifted = set(result.drift)
    for worker in _single(workers):
        if worker.worker not in drifted and worker.worker not in planned:
            assigned.setdefault(worker.worker, worker.pools[0])


def _single(workers: list[OwnedWorker]) -> Iterator[OwnedWorker]:
    return (w for w in workers if w.routable and len(w.pools) == 1)


def _strips(
    stored: StoredPolicy,
    workers: list[OwnedWorker],
    records: Mapping[str, Owned],
    planned: set[str],
) -> list[Step]:
    """Writes that strip a replaced version's pool taints from routable workers the plan
    does not move anyway (a move's write strips them too)."""
    if not stored.retired:
        return []
    steps = []
    for worker in _single(workers):
        held = stored.retired.intersection(records[worker.worker].record.taints)
        if held and worker.worker not in planned:
            steps.append(Step(worker.worker, min(held), worker.pools[0], "retired"))
    return steps
