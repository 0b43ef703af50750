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
   worker in this term. An elastic policy's counts follow its pools' demand: every
   daemon's requests in flight and waiting (``demand.Demand``: this daemon's own, the
   others' records in the pool view), settled by the hysteresis window the history keeps
   (``elastic.py``); its step runs at least every ``DEMAND_EVERY``, and every daemon
   publishes its share (``demand.DemandPublisher``, a task of ``run``) while a stored
   policy is elastic.
3. Drift: a worker whose pool taints differ from ``assigned`` was changed by another writer
   (the leader's own writes update ``assigned`` as they commit, and a round never plans
   while its writes are in flight). It is reported once per change — a history entry
   (so a DRIFT event on every daemon), a warning line, ``dynamod_pool_drift_total`` — and
   put back by the plan's moves unless the policy is paused (a paused policy is planned
   and reported, and nothing is written).
4. Writes, 16 at a time, each through ``Control.update_taints`` (``TaintWriter``), fenced
   and audited (``reconcile_step``). A move budget (``max_moves`` per ``move_interval``)
   holds moves back; the round after the window refills makes them. A failed move holds
   back that worker alone (``move_failures``: a back-off from 1 s doubling to 60 s, or,
   refused, until the policy, the worker or the settings change).
5. Routable workers holding one pool and not drifted are adopted: ``assigned`` is what
   they hold. A new leader starts with nothing assigned, so the pools its workers hold when
   it takes over are the truth; a change made while nobody led (at most the lease's TTL
   plus a second) is adopted, not put back (the counts still follow the policy).

Each policy's step (``reconcile_step.Leading.step``) returns when it wants to run again;
the leader waits for the earliest of those or the next change. Only losing the lease ends
the term (at the next ``fence()``, before any further write): a store error in a round
(the history read or written, a write) is logged and the round runs again within the term
after the one back-off. Any other failure is logged and the reconciler starts again after
the one back-off; the daemon carries on. Status and dry runs plan from the same observed
state (``plan_of``) and never change the leader's memory.

A leader's first read of a policy's history in its term settles the intents found there
(``intents.py``): the batches a leader sent and did not live to log. Each move the store
shows made is appended to the history and written to this daemon's audit log, marked
``reconciled`` (by this leader, in this epoch) with the epoch, leader and time it was sent;
each it does not show is dropped, with a warning line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Final

from dynamod.audit import AuditLog
from dynamod.backoff import Backoff
from dynamod.discovery.view import WorkerView
from dynamod.discovery_events import DiscoveryEvent, WorkerModified, WorkerRemoved
from dynamod.errors import NotLeaderError, StoreError
from dynamod.pool_results import MoveFailure
from dynamod.pools.demand import DEMAND_EVERY, Demand, DemandPublisher, DemandReport
from dynamod.pools.history import NO_WINDOW, HistoryWriter
from dynamod.pools.leader import DEFAULT_TTL, LeaderElection, Leadership
from dynamod.pools.move_budget import MoveBudget
from dynamod.pools.plan import Plan
from dynamod.pools.policy import PoolPolicy
from dynamod.pools.policy_view import PolicyView
from dynamod.pools.pool_events import PoolEvents
from dynamod.pools.pool_metrics import PoolMetrics
from dynamod.pools.reconcile_step import (
    BatchWriter,
    Check,
    LeaderTerm,
    Leading,
    Observed,
    PolicyTerm,
    TaintWriter,
    Write,
    nothing_observed,
)
from dynamod.pools.reconciled import settle_into
from dynamod.pools.stored import StoredPolicy, in_force
from dynamod.store import Store
from dynamod.tasks import race, wait_any

__all__ = ["BatchWriter", "Check", "Observed", "PoolReconciler", "TaintWriter", "Write"]

log = logging.getLogger(__name__)

FOLLOWER_PACE: Final = 0.25
"""Seconds between two plans of a follower (for its gauges), at least."""
RETRY_FIRST: Final = 0.05
RETRY_CAP: Final = 5.0
"""The back-off after a round's store error, and after the reconciler itself failed."""


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
        batch: BatchWriter | None = None,
        demand: Callable[[], DemandReport] | None = None,
        audit: AuditLog | None = None,
    ) -> None:
        self.store = store
        self.workers = workers
        self.identity = identity
        self.ttl = ttl
        self.observe = observe
        self.events = events or PoolEvents()
        self.metrics = metrics or PoolMetrics()
        self.view = PolicyView(store, self.events)
        self.conflicts: dict[str, str] = {}
        """Stored policies not reconciled, and why (``stored.in_force``)."""
        self._dirty = asyncio.Event()
        self._healthy: dict[str, bool] = {}
        own = demand or (lambda: DemandReport(identity))
        self._publisher = DemandPublisher(store, own, self._elastic)
        self._leading = Leading(
            store, workers, writer, identity, observe, self.metrics,
            Demand(own, lambda: self.view.demand), batch, audit,
        )  # fmt: skip
        self.owners = self._leading.owners
        self._term: LeaderTerm | None = None
        self._election: LeaderElection | None = None

    # What the daemon tells it

    def engine_reported(self, key: str, healthy: bool) -> None:
        """A worker's engine reported (``Router.report``): plan again when its health
        flipped."""
        if self._healthy.get(key, True) != healthy:
            self._dirty.set()
        self._healthy[key] = healthy

    def settings_changed(self) -> None:
        """The daemon reloaded its settings: refused moves are tried again."""
        self._leading.settings += 1
        self._dirty.set()

    def _on_worker(self, event: DiscoveryEvent) -> None:
        if isinstance(event, WorkerRemoved):
            self._healthy.pop(event.record.key, None)
            self._leading.own.pop(event.record.key, None)
        if not self.view.policies:
            return
        if isinstance(event, WorkerModified) and self._leading.seen(
            event.record.key, event.revision
        ):
            return  # the leader's own move coming back: nothing new to plan for
        self._dirty.set()

    # What the API asks (reads: they never change the leader's memory)

    @property
    def leadership(self) -> Leadership | None:
        """This daemon's term as leader, while it lasts."""
        term = self._term
        return term.leadership if term is not None and not term.leadership.lost.is_set() else None

    def plan_of(self, stored: StoredPolicy) -> Plan:
        """The plan of ``stored`` from this daemon's view now (with what the leader
        assigned and its elastic window, when this daemon leads; a follower's window is the
        one the leader last wrote in the history)."""
        memory = self._memory_of(stored.name)
        if memory is not None:
            assigned, window = memory.assigned, memory.window
        else:
            history = self.view.histories.get(stored.name)
            assigned, window = None, history.window if history is not None else NO_WINDOW
        return self._leading.plan_of(stored.policy, assigned, window)[0]

    def budget_left(self, name: str) -> int | None:
        memory = self._memory_of(name)
        if memory is None:
            return None
        return memory.budget.allowed(asyncio.get_running_loop().time())

    def failing(self, name: str) -> tuple[MoveFailure, ...]:
        """The workers whose moves of policy ``name`` are failing: the leader's own, else as
        the leader last wrote them in the history."""
        term = self._term
        if term is not None:
            return term.failures.of(name)
        history = self.view.histories.get(name)
        return history.failing if history is not None else ()

    def _elastic(self) -> bool:
        """Whether any stored policy is elastic (this daemon publishes its demand then)."""
        return any(s.policy.elastic is not None for s in self.view.policies.values())

    def _memory_of(self, name: str) -> PolicyTerm | None:
        term = self._term
        return term.policies.get(name) if term is not None else None

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
            publishing = group.create_task(self._publisher.run(), name="pool demand")
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
                publishing.cancel()

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
        moves must not cost it a plan per event. With an elastic policy it plans at least
        every ``DEMAND_EVERY`` too (demand changes without an event)."""
        await asyncio.sleep(FOLLOWER_PACE)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DEMAND_EVERY if self._elastic() else None):
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
        term = self._term = LeaderTerm(leadership)
        self.metrics.lead(term.epoch)
        log.info("%s leads the pools (epoch %d)", self.identity, term.epoch)
        errors = Backoff(RETRY_FIRST * 4, RETRY_CAP)
        try:
            while not leadership.lost.is_set() and self.view.policies:
                self._dirty.clear()
                term.wake_at = None
                try:
                    await self._round(term)
                except StoreError as exc:
                    delay = errors.delay()
                    log.warning(
                        "pool round failed, the term goes on: %s; the round runs again in "
                        "%.2f s", exc, delay,
                    )  # fmt: skip
                    term.wake(asyncio.get_running_loop().time() + delay)
                else:
                    errors.reset()
                await self._wait(term)
        except NotLeaderError as exc:
            log.warning("pool writes stopped: %s", exc)
        finally:
            self._term = None
            self._leading.own.clear()
            self.metrics.lead(0)

    async def _wait(self, term: LeaderTerm) -> None:
        """Until the next change, or the time a step asked for, or the end of the term."""
        loop = asyncio.get_running_loop()
        delay = None if term.wake_at is None else max(0.0, term.wake_at - loop.time())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await wait_any(self._dirty, term.leadership.lost)

    async def _round(self, term: LeaderTerm) -> None:
        chosen, self.conflicts = in_force(list(self.view.policies.values()))
        for name in set(term.policies) - {s.name for s in chosen}:
            del term.policies[name]
        self._forget_gone()
        for stored in chosen:
            memory = await self._memory(term, stored.policy)
            term.wake(await self._leading.step(term, stored, memory))
        for name, memory in term.policies.items():
            memory.history.keep_failing(term.failures.of(name))
            await memory.history.flush(self.store, term.fence)

    async def _memory(self, term: LeaderTerm, policy: PoolPolicy) -> PolicyTerm:
        memory = term.policies.get(policy.name)
        budget = MoveBudget.of(policy)
        if memory is None:
            history = HistoryWriter(policy.name, self.identity, term.epoch)
            await history.load(self.store)
            settle_into(history, history.inherited, self._leading.settling(term, policy))
            history.settled()
            memory = term.policies[policy.name] = PolicyTerm(history, budget)
        elif (memory.budget.max_moves, memory.budget.interval) != (
            budget.max_moves,
            budget.interval,
        ):
            memory.budget = budget
        return memory
