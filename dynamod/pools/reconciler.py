"""The pool reconciler: every dynamod plans each stored policy; the one leader writes it.

``PoolReconciler.run()`` is one task of the daemon's task group. It runs the pool view
(``view.PolicyView``: policies, histories, leader), campaigns for the leader key
(``leader.LeaderElection``) and plans again at every change that can matter: a worker
added, removed or re-tainted (the worker view's listener), a worker's engine turning
healthy or unhealthy (``engine_reported``), a policy applied, changed, paused, resumed or
removed. A follower's plan feeds the gauges and ``status``; only the leader writes. While
no policy is stored, nobody campaigns: pools cost a fleet without policies nothing but
three idle watches per daemon.

A round, for each policy in force (``stored.in_force``), by name:

1. The owned workers: those its selector matches now, routable unless their engine reports
   them unhealthy or they hold an operator taint (``OPERATOR_TAINTS``: the cordon, and any
   taint marking a worker as draining), with this daemon's in-flight requests and the
   engine's KV blocks in use as load.
2. ``plan.plan`` with ``assigned``: the pool the leader last set or confirmed on each
   worker in this term.
3. Drift: a worker whose pool taints differ from ``assigned`` was changed by another writer
   (the leader's own writes update ``assigned`` as they commit, and a round never plans
   while its writes are in flight). It is reported once per change — a history entry
   (so a DRIFT event on every daemon), a warning line, ``dynamod_pool_drift_total`` — and
   put back by the plan's moves unless the policy is paused (a paused policy is planned
   and reported, and nothing is written).
4. Writes, 16 at a time, each through ``Control.update_taints`` (``TaintWriter``): a replace
   of the worker's caller taints with the policy's pool taints (and its retired ones)
   swapped for the new pool, at the revision the plan saw (a newer record fails it, and the
   newer record's event brings another round), with a ``check`` that calls the term's
   ``fence()`` right before the compare-and-swap, and the policy, the move and the epoch in
   the audit line. A move budget (``max_moves`` per ``move_interval``) holds moves back;
   the round after the window refills makes them.
5. ReadyRequest workers holding one pool and not drifted are adopted: ``assigned`` is what
   they hold. A new leader starts with nothing assigned, so the pools its workers hold when
   it takes over are the truth; a change made while nobody led (at most the lease's TTL
   plus a second) is adopted, not put back (the counts still follow the policy).

A move whose outcome is unknown (the store timed out) forgets what was assigned to that
worker, so the next round reads the truth from the store instead of taking its own write
for drift. Losing the lease ends the term at the next ``fence()``, before any further
write. Any other failure is logged and retried after the one back-off; the reconciler,
and with it the daemon, carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, NamedTuple, Protocol

from dynamod.backoff import Backoff
from dynamod.discovery.view import WorkerView
from dynamod.discovery_events import DiscoveryEvent, WorkerModified, WorkerRemoved
from dynamod.errors import (
    DynamoError,
    NotLeaderError,
    RevisionMismatchError,
    WorkerNotFoundError,
)
from dynamod.pool_results import DriftSeen, PoolMove
from dynamod.pools.history import FLUSH_EVERY, HistoryWriter
from dynamod.pools.leader import DEFAULT_TTL, LeaderElection, Leadership
from dynamod.pools.move_budget import MoveBudget
from dynamod.pools.owners import Owners
from dynamod.pools.plan import OwnedWorker, Plan, first_moves, held_pools, plan
from dynamod.pools.policy import PoolPolicy
from dynamod.pools.policy_view import PolicyView
from dynamod.pools.pool_events import PoolEvents
from dynamod.pools.pool_metrics import PoolMetrics
from dynamod.pools.stored import StoredPolicy, in_force
from dynamod.records import WorkerRecord
from dynamod.results import UpdateOutcome
from dynamod.store import Store
from dynamod.taints import OPERATOR_TAINTS, TaintUpdate, caller_taints
from dynamod.tasks import race, together, wait_any

log = logging.getLogger(__name__)

CONCURRENCY: Final = 16
"""Moves written at once (as ``Control``'s bulk updates)."""
FOLLOWER_PACE: Final = 0.25
"""Seconds between two plans of a follower (for its gauges), at least."""
RETRY_FIRST: Final = 0.05
RETRY_CAP: Final = 5.0
"""The back-off after a failed move, and after the reconciler itself failed."""

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
    """What the daemon knows of a worker beside its record."""

    healthy: bool = True
    in_flight: int = 0
    cached_blocks: int = 0


def nothing_observed(key: str) -> Observed:
    return Observed()


@dataclass
class _PolicyTerm:
    """A leader's memory of one policy during its term."""

    history: HistoryWriter
    budget: MoveBudget
    assigned: dict[str, str] = field(default_factory=dict)
    written: dict[str, int] = field(default_factory=dict)
    """Worker -> the record revision the leader's last move wrote, until the view has it:
    a view behind the leader's own write shows the pool the write replaced, which is
    neither drift nor a reason to move again."""
    reported: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Drift already reported: worker -> the pool taints it held then."""


class _Term:
    """One term as leader: its fence, and each policy's memory."""

    def __init__(self, leadership: Leadership) -> None:
        self.leadership = leadership
        self.policies: dict[str, _PolicyTerm] = {}
        self.backoff = Backoff(RETRY_FIRST, RETRY_CAP)
        self.wake_at: float | None = None
        """Loop time of the next round without a change: a budget refill or a retry."""

    @property
    def epoch(self) -> int:
        return self.leadership.epoch

    def fence(self) -> int:
        return self.leadership.fence()

    def check(self, before: WorkerRecord, after: WorkerRecord) -> None:
        """The ``check`` of each write: the fence, right before the compare-and-swap."""
        self.leadership.fence()

    def wake(self, at: float) -> None:
        self.wake_at = at if self.wake_at is None else min(self.wake_at, at)


class PoolReconciler:
    """See the module docstring."""

    def __init__(
        self,
        store: Store,
        workers: WorkerView,
        writer: TaintWriter,
        *,
        identity: str,
        ttl: float = DEFAULT_TTL,
        observe: Callable[[str], Observed] = nothing_observed,
        events: PoolEvents | None = None,
        metrics: PoolMetrics | None = None,
    ) -> None:
        self.store = store
        self.workers = workers
        self.writer = writer
        self.identity = identity
        self.ttl = ttl
        self.observe = observe
        self.events = events or PoolEvents()
        self.metrics = metrics or PoolMetrics()
        self.view = PolicyView(store, self.events)
        self.owners = Owners(workers)
        """The workers each policy selects, indexed (no scan of the fleet per policy)."""
        self.conflicts: dict[str, str] = {}
        """Stored policies not reconciled, and why (``stored.in_force``)."""
        self._dirty = asyncio.Event()
        self._healthy: dict[str, bool] = {}
        self._echoes: dict[str, int] = {}
        """Worker key -> the revision of the leader's move the view has not shown yet."""
        self._term: _Term | None = None
        self._election: LeaderElection | None = None

    # What the daemon tells it

    def engine_reported(self, key: str, healthy: bool) -> None:
        """A worker's engine reported (``Router.report``): plan again when its health
        flipped."""
        if self._healthy.get(key, True) != healthy:
            self._dirty.set()
        self._healthy[key] = healthy

    def _on_worker(self, event: DiscoveryEvent) -> None:
        if isinstance(event, WorkerRemoved):
            self._healthy.pop(event.record.key, None)
        if not self.view.policies:
            return
        if isinstance(event, WorkerModified):
            echo = self._echoes.pop(event.record.key, None)
            if echo == event.revision:
                return  # the leader's own move coming back: nothing new to plan for
        self._dirty.set()

    # What the API asks

    @property
    def leadership(self) -> Leadership | None:
        """This daemon's term as leader, while it lasts."""
        term = self._term
        return term.leadership if term is not None and not term.leadership.lost.is_set() else None

    def plan_of(self, stored: StoredPolicy) -> Plan:
        """The plan of ``stored`` from this daemon's view now (with what the leader
        assigned, when this daemon leads)."""
        term = self._term
        memory = term.policies.get(stored.name) if term is not None else None
        workers, _ = self._owned(stored.policy, memory)
        return plan(stored.policy, workers, assigned=memory.assigned if memory else None)

    def budget_left(self, name: str) -> int | None:
        term = self._term
        memory = term.policies.get(name) if term is not None else None
        if memory is None:
            return None
        return memory.budget.allowed(asyncio.get_running_loop().time())

    # The task

    async def run(self) -> None:
        """Reconcile until cancelled; a failure is logged and the work starts again after
        the one back-off, so the daemon never goes down with it."""
        backoff = Backoff(RETRY_FIRST * 4, RETRY_CAP)
        unlisten = self.workers.listen(self._on_worker)
        try:
            while True:
                started = time.monotonic()
                try:
                    await self._run()
                except Exception:
                    log.exception("the pool reconciler failed; it starts again")
                if time.monotonic() - started > RETRY_CAP:
                    backoff.reset()
                await backoff.wait()
        finally:
            unlisten()
            self.metrics.lead(0)

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as group:
            watching = group.create_task(self.view.run(), name="pool view")
            unlisten = self.view.listen(self._dirty.set)
            try:
                await wait_any(self.view.ready)
                while True:
                    await self._until_policies()
                    async with LeaderElection(
                        self.store, identity=self.identity, ttl=self.ttl
                    ) as election:
                        self._election = election
                        await self._serve(election)
                    self._election = None
            finally:
                unlisten()
                self._election = None
                watching.cancel()

    async def _until_policies(self) -> None:
        """Wait for a stored policy: with none, this daemon does not campaign (and writes
        nothing to the store)."""
        while not self.view.policies:
            self._dirty.clear()
            self._observe()
            await self._dirty.wait()

    async def _serve(self, election: LeaderElection) -> None:
        """Follow, or lead when elected, while any policy is stored."""
        while self.view.policies:
            leadership = election.leading
            if leadership is not None:
                await self._lead(leadership)
                continue
            self._dirty.clear()
            self._observe()
            await race(self._paced(), election.wait_leading())

    async def _paced(self) -> None:
        """A follower plans again at the next change, at most every ``FOLLOWER_PACE``: its
        plans only feed the gauges (``status`` plans afresh), and a burst of thousands of
        moves must not cost it a plan per event."""
        await asyncio.sleep(FOLLOWER_PACE)
        await self._dirty.wait()

    def _observe(self) -> None:
        """A follower's round: plans for the gauges and status, no writes."""
        chosen, self.conflicts = in_force(list(self.view.policies.values()))
        self._forget_gone()
        for stored in chosen:
            self.metrics.planned(self.plan_of(stored))

    def _forget_gone(self) -> None:
        for name in self.metrics.policies - set(self.view.policies):
            self.metrics.forget(name)

    # Leading

    async def _lead(self, leadership: Leadership) -> None:
        term = self._term = _Term(leadership)
        self.metrics.lead(term.epoch)
        log.info("%s leads the pools (epoch %d)", self.identity, term.epoch)
        try:
            while not leadership.lost.is_set() and self.view.policies:
                self._dirty.clear()
                term.wake_at = None
                await self._round(term)
                await self._wait(term)
        except NotLeaderError as exc:
            log.warning("pool writes stopped: %s", exc)
        finally:
            self._term = None
            self._echoes.clear()
            self.metrics.lead(0)

    async def _wait(self, term: _Term) -> None:
        loop = asyncio.get_running_loop()
        delay = None if term.wake_at is None else max(0.0, term.wake_at - loop.time())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await wait_any(self._dirty, term.leadership.lost)

    async def _round(self, term: _Term) -> None:
        chosen, self.conflicts = in_force(list(self.view.policies.values()))
        for name in set(term.policies) - {s.name for s in chosen}:
            del term.policies[name]
        self._forget_gone()
        for stored in chosen:
            memory = await self._memory(term, stored.policy)
            await self._reconcile(term, stored, memory)
        for memory in term.policies.values():
            await memory.history.flush(self.store, term.fence)

    async def _memory(self, term: _Term, policy: PoolPolicy) -> _PolicyTerm:
        memory = term.policies.get(policy.name)
        budget = MoveBudget.of(policy)
        if memory is None:
            history = HistoryWriter(policy.name, self.identity, term.epoch)
            await history.load(self.store)
            memory = term.policies[policy.name] = _PolicyTerm(history, budget)
        elif (memory.budget.max_moves, memory.budget.interval) != (
            budget.max_moves,
            budget.interval,
        ):
            memory.budget = budget
        return memory

    async def _reconcile(self, term: _Term, stored: StoredPolicy, memory: _PolicyTerm) -> None:
        policy = stored.policy
        workers, records = self._owned(policy, memory)
        for gone in set(memory.assigned) - set(records):
            del memory.assigned[gone]
        for gone in set(memory.written) - set(records):
            del memory.written[gone]
        result = plan(policy, workers, assigned=memory.assigned)
        self.metrics.planned(result)
        self._note_drift(term, stored, result, records, memory)
        if policy.paused:
            return
        now = asyncio.get_running_loop().time()
        steps = [Step(*m) for m in first_moves(result, memory.budget.allowed(now))]
        if len(steps) < len(result.moves):
            refill = memory.budget.refills_at(now)
            if refill is not None:
                term.wake(refill)
        planned = {m.worker for m in result.moves}
        steps += _strips(stored, workers, records, planned)
        _adopt(memory.assigned, workers, result, planned)
        await self._write_all(term, stored, memory, steps, records)
        if steps:
            self._dirty.set()  # plan again once: the gauges and the next moves see these

    def _owned(
        self, policy: PoolPolicy, memory: _PolicyTerm | None = None
    ) -> tuple[list[OwnedWorker], dict[str, Owned]]:
        """The workers ``policy`` owns now, as the plan sees them, and their records (with
        the revision seen) by id. A worker whose record the view has not yet seen at the
        revision the leader's last move wrote holds, for the plan, the pool it was moved
        to (``_PolicyTerm.written``)."""
        workers: list[OwnedWorker] = []
        records: dict[str, Owned] = {}
        written = memory.written if memory is not None else {}
        for record in self.owners.of(policy.match):
            seen = self.observe(record.key)
            routable = seen.healthy and not OPERATOR_TAINTS.intersection(record.taints)
            domain = None
            if policy.spread_by is not None:
                domain = record.runtime_config.topology_domains.get(policy.spread_by)
            revision = self.workers.revision_of(record.key)
            held = held_pools(record.taints, policy)
            if written and record.instance_id in written:
                held = _behind(memory, record.instance_id, revision, held)
            worker = OwnedWorker(
                record.instance_id, held, seen.in_flight, seen.cached_blocks, domain, routable
            )
            workers.append(worker)
            records[record.instance_id] = Owned(record, revision)
        return workers, records

    def _note_drift(
        self,
        term: _Term,
        stored: StoredPolicy,
        result: Plan,
        records: Mapping[str, Owned],
        memory: _PolicyTerm,
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
        term: _Term,
        stored: StoredPolicy,
        memory: _PolicyTerm,
        steps: list[Step],
        records: Mapping[str, Owned],
    ) -> None:
        pending = iter(steps)

        async def writing() -> None:
            for step in pending:
                await self._move(term, stored, memory, step, records[step.worker])
                if len(memory.history.unwritten) >= FLUSH_EVERY:
                    await memory.history.flush(self.store, term.fence)

        await together(*(writing() for _ in range(min(CONCURRENCY, len(steps)))))

    async def _move(
        self,
        term: _Term,
        stored: StoredPolicy,
        memory: _PolicyTerm,
        move: Step,
        owned: Owned,
    ) -> None:
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
        try:
            outcome = await self.writer(
                record,
                update,
                expect_revision=owned.revision,
                check=term.check,
                audit=audit,
            )
        except NotLeaderError:
            raise
        except (RevisionMismatchError, WorkerNotFoundError) as exc:
            log.debug("pool move of %s skipped, its record changed: %s", move.worker, exc)
            return
        except DynamoError as exc:
            self._failed(term, policy, move, exc)
            memory.assigned.pop(move.worker, None)
            return
        if self.workers.revision_of(record.key) < outcome.revision:
            self._echoes[record.key] = outcome.revision
        self._moved(term, policy, memory, move, outcome)

    def _moved(
        self,
        term: _Term,
        policy: PoolPolicy,
        memory: _PolicyTerm,
        move: Step,
        outcome: UpdateOutcome,
    ) -> None:
        memory.assigned[move.worker] = move.to_pool
        memory.written[move.worker] = outcome.revision
        memory.reported.pop(move.worker, None)
        if move.why != "retired":
            memory.budget.spend(asyncio.get_running_loop().time())
        made = PoolMove(
            move.worker, move.from_pool or "", move.to_pool, move.why, time.time(), term.epoch,
            outcome.revision, self.identity,
        )  # fmt: skip
        memory.history.add(made)
        self.metrics.moves.labels(policy.name, move.why).inc()
        term.backoff.reset()
        log.info(
            "pool policy %s: worker %s %s -> %s (%s; epoch %d, revision %d)",
            policy.name, move.worker, move.from_pool or "no pool", move.to_pool, move.why,
            term.epoch, outcome.revision,
        )  # fmt: skip

    def _failed(self, term: _Term, policy: PoolPolicy, move: Step, exc: DynamoError) -> None:
        self.metrics.failures.labels(policy.name, type(exc).__name__).inc()
        delay = term.backoff.delay()
        term.wake(asyncio.get_running_loop().time() + delay)
        log.warning(
            "pool policy %s: moving worker %s to %s failed (%s); trying again in %.2f s",
            policy.name, move.worker, move.to_pool, exc, delay,
        )  # fmt: skip


def _behind(
    memory: _PolicyTerm | None, worker: str, revision: int, held: tuple[str, ...]
) -> tuple[str, ...]:
    """What ``worker`` holds for the plan: its pool taints, or, while the view is behind the
    leader's own last write to it, the pool that write set."""
    assert memory is not None
    if revision >= memory.written[worker]:
        del memory.written[worker]
        return held
    assigned = memory.assigned.get(worker)
    return (assigned,) if assigned is not None else held


def _drift_action(policy: PoolPolicy, excluded: bool) -> str:
    if policy.paused:
        return "left as it is: the policy is paused"
    if excluded:
        return "left as it is: the worker is not routable"
    return "put back"


def _adopt(
    assigned: dict[str, str], workers: list[OwnedWorker], result: Plan, planned: set[str]
) -> None:
    """ReadyRequest workers holding one pool, not drifted, not about to move: what they hold is
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
