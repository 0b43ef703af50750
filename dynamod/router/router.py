"""The router: picks a worker for each request, and parks the ones no worker can take yet.

Use::

    router = Router(RouterKnobs(), registry=registry)
    router.apply(event)                     # every discovery event, as it arrives
    async with router.route(request) as assignment:
        ...                                 # send it to assignment.worker.address
        router.prefill_done(assignment)     # optional, on the first token
    router.close()                          # at shutdown: waiting requests fail

The contract:

* ``route`` / ``acquire`` assigns at once when an eligible worker is not busy (cost and
  selection in ``scoring.py``; how a decision avoids looking at every worker in
  ``choice.py``). When eligible workers exist but all are busy, the request waits, first
  come first served. When none exists it fails at once with ``NoEligibleWorkerError``, or
  waits up to ``config.no_worker_wait``. A request's ``max_wait`` replaces both limits. A
  full queue raises ``QueueFullError``, the end of a wait ``QueueTimeoutError``, a closed
  router ``ShuttingDownError``.
* Every change re-checks the waiting requests, synchronously, inside the call that made it:
  ``apply`` (any discovery event, a taint update included), ``release``,
  ``prefill_done`` and ``reconfigure``. No polling, no sleep. Invariant after every call:
  no waiting request has an eligible worker that is not busy. So a newcomer that finds a
  free worker takes nothing a waiting request could use, and arrival order holds.
* A waiter dispatched that way has its worker reserved at that moment;
  ``Assignment.waited`` says how long it waited. A waiter whose situation changes is judged
  again. When its last eligible worker stops qualifying (a taint moved away, a cordon, a
  removal), it keeps waiting for ``config.settle_window`` for another worker to qualify
  (a remove-then-add move), then fails with ``NoEligibleWorkerError``; with a zero window,
  or when its no-worker limit is longer, it is judged as a new request would be.
* Cost of the work: a decision looks at one worker per eligible group plus the workers
  with a prefix overlap (``choice.py``), not at every worker. Waiters are kept in cases
  (``queue.py``): re-checking the queue costs one decision per case of waiters that ask
  for the same workers, plus one per waiter dispatched or whose situation changes.
* Eligibility also asks what a request needs of a worker's card (``RouteRequest.needs``,
  ``fit.py``): the reading most of the model's workers publish, and a context that holds
  the request. ``reading(model)`` says which reading that is; workers of another one are
  left out, counted and logged (``dissent.py``).
* Load is what this router has in flight per worker, reserved when the worker is chosen
  and given back by ``release`` (idempotent; ``route`` calls it on exit).
* What a worker's engine reports (``report``) enters only whether it is busy: a worker is
  busy while its engine reports requests waiting in its own queue, or reports itself
  unhealthy (``reported.py``); the report that frees it dispatches waiting requests.
* ``watch(callback)``: ``callback(key)`` after every change of the load on a worker or of
  its engine's report, inside the call that made it (a drain waits on these, not on a
  timer: ``dynamod/drain_watch.py``).
* Single-threaded: call everything from the event loop's thread. The router owns no task.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import random
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, replace

from prometheus_client import CollectorRegistry

from dynamod.discovery_events import DiscoveryEvent, ViewResync
from dynamod.engine_events import EngineLoad
from dynamod.errors import (
    NoEligibleWorkerError,
    QueueFullError,
    QueueTimeoutError,
    RoutingError,
    ShuttingDownError,
)
from dynamod.load import IDLE, Busy, Load
from dynamod.records import ModelCard, WorkerRecord
from dynamod.router.choice import Chooser, Pick
from dynamod.router.dissent import Dissent
from dynamod.router.fit import ModelReading
from dynamod.router.groups import Group
from dynamod.router.knobs import RouterKnobs
from dynamod.router.prefix import OverlapSource, PrefixIndex
from dynamod.router.queue import Case, PendingQueue, Waiter, WaitState, by_arrival
from dynamod.router.router_metrics import RouterMetrics
from dynamod.router.saturation import ReportedLoads, describe
from dynamod.router.scoring import CostTerms, cost_terms, load_rank, probabilities
from dynamod.router.table import MESSAGE_WORKERS, RoutingTable, why_not
from dynamod.router.types import (
    Assignment,
    Explanation,
    Outcome,
    RouteRequest,
    WorkerExplanation,
)
from dynamod.taints import RoutingConstraints, preference


@dataclass
class _Reservation:
    """The load one assignment holds on its worker, until released."""

    key: str
    prefill_tokens: int
    kv_blocks: int
    prefilling: bool = True


class Router:
    """Routes requests over the workers it learns from ``apply``; see the module docstring.

    ``rng`` drives tie-breaks and sampling (seed it for reproducible tests); ``registry``
    receives the metrics (a fresh ``CollectorRegistry`` when none is given); ``overlaps``
    says which workers hold a prompt's leading blocks (by default a ``PrefixIndex`` of what
    this router sent, sized by the config).
    """

    def __init__(
        self,
        config: RouterKnobs | None = None,
        *,
        rng: random.Random | None = None,
        registry: CollectorRegistry | None = None,
        overlaps: OverlapSource | None = None,
    ) -> None:
        self.config = config if config is not None else RouterKnobs()
        self.registry = registry if registry is not None else CollectorRegistry()
        self._rng = rng if rng is not None else random.Random()
        self._loads: dict[str, Load] = {}
        self._table = RoutingTable(ranker=self._rank)
        self._chooser = Chooser(self.config, self._rng, self._table.group_of)
        self._held: dict[int, _Reservation] = {}
        self._tickets = itertools.count()
        self._prefix: OverlapSource = (
            overlaps
            if overlaps is not None
            else PrefixIndex(self.config.prefix_ttl, self.config.prefix_capacity)
        )
        self._metrics = RouterMetrics(self.registry)
        self._queue = PendingQueue(self.config.max_queue, self._metrics.depth_changed)
        self._reported = ReportedLoads()
        self._dissent = Dissent(self._table, self._metrics.disagreeing)
        self._closed = False
        self._watchers: list[Callable[[str], None]] = []

    @property
    def table(self) -> RoutingTable:
        """The worker view (read it; change it only through ``apply``)."""
        return self._table

    @property
    def queue_depth(self) -> int:
        """Requests waiting now, all models."""
        return len(self._queue)

    @property
    def closed(self) -> bool:
        return self._closed

    def depth(self, model: str) -> int:
        return self._queue.depth(model)

    def card(self, model: str) -> ModelCard | None:
        """A model card of ``model``'s workers, of the reading most of them publish; None
        when no worker serves it."""
        return self._table.card(model)

    def reading(self, model: str) -> ModelReading | None:
        """How requests for ``model`` are read (``fit.py``); None when no worker serves it."""
        return self._table.reading(model)

    def unserved(self, model: str) -> str:
        """The sentence for a request naming a model no worker serves."""
        return self._table.unsatisfiable(model, RoutingConstraints())

    def load(self, key: str) -> Load:
        """What this router has in flight on the worker ``key``."""
        return self._loads.get(key, IDLE)

    def reported(self, key: str) -> EngineLoad | None:
        """What the worker ``key``'s engine last reported, if anything is known."""
        return self._reported.get(key)

    def report(self, key: str, load: EngineLoad | None) -> None:
        """What the worker ``key``'s engine says now (None: nothing known any more)."""
        freed = self._reported.set(key, load)
        self._table.rerank(key)
        self._changed(key)
        if freed:
            self._offer_worker(key)

    def watch(self, watcher: Callable[[str], None]) -> Callable[[], None]:
        """Call ``watcher(key)`` after every change of this router's load on the worker
        ``key`` or of its engine's report; returns the way to stop. It runs inside the call
        that made the change, so it must be quick and must not raise."""
        self._watchers.append(watcher)
        return lambda: self._watchers.remove(watcher)

    def _changed(self, key: str) -> None:
        for watcher in tuple(self._watchers):
            watcher(key)

    def apply(self, event: DiscoveryEvent) -> None:
        """Fold a discovery event into the table, then re-check the affected waiters."""
        if isinstance(event, ViewResync):
            for model in self._table.apply(event):
                self._recheck(model)
                self._dissent.check(model)
            return
        key = event.record.key
        before = self._table.group_of(key)
        for model in self._table.apply(event):
            self._recheck(model, (before, self._table.group_of(key)))
            self._dissent.check(model)

    @contextlib.asynccontextmanager
    async def route(self, request: RouteRequest) -> AsyncIterator[Assignment]:
        """Hold a worker for the body of the ``async with``; released on exit."""
        assignment = await self.acquire(request)
        try:
            yield assignment
        finally:
            self.release(assignment)

    async def acquire(self, request: RouteRequest) -> Assignment:
        """Choose a worker, waiting if the contract says so. Pair with ``release``."""
        self._refuse_if_closed(request)
        started = time.perf_counter()
        required = request.constraints.required_taints
        groups = self._table.eligible_groups(request.model, required, request.needs)
        pick = self._choose(request, groups)
        if pick is not None:
            assignment = self._assign(request, pick, 0.0)
            self._metrics.decided(request.model, "routed", time.perf_counter() - started)
            return assignment
        eligible = _any_member(groups, request.exclude)
        return await self._park(request, WaitState.BUSY if eligible else WaitState.NO_WORKER)

    def release(self, assignment: Assignment) -> None:
        """Give the assignment's load back and offer its worker to the waiters. Idempotent."""
        held = self._held.pop(assignment.ticket, None)
        if held is None:
            return
        prefill = held.prefill_tokens if held.prefilling else 0
        self._unload(held.key, Load(1, prefill, held.kv_blocks))
        self._offer_worker(held.key)

    def prefill_done(self, assignment: Assignment) -> None:
        """The worker finished the prompt: its prefill tokens stop counting. Idempotent."""
        held = self._held.get(assignment.ticket)
        if held is None or not held.prefilling:
            return
        held.prefilling = False
        self._unload(held.key, Load(0, held.prefill_tokens, 0))
        self._offer_worker(held.key)

    def reconfigure(self, config: RouterKnobs) -> None:
        """Take new knobs (a SIGHUP reload). Waiting requests keep their deadlines; the
        prefix index keeps the TTL and capacity it was built with until a restart. New
        weights or busy thresholds re-rank every worker, and may free some for waiters."""
        self.config = config
        self._chooser.config = config
        self._queue.capacity = config.max_queue
        self._table.rerank()
        for model in self._table.models():
            self._recheck(model)

    def close(self) -> None:
        """Refuse new requests and fail every waiting one with ``ShuttingDownError``."""
        self._closed = True
        for waiter in self._queue:
            if waiter.pending:
                self._fail(waiter, self._shutting_down(waiter.request), "shutdown")

    def explain(self, request: RouteRequest) -> Explanation:
        """What ``route`` would do now, worker by worker, with every cost term. Brute force
        on purpose: it is the operator's view of every worker, and the oracle the fast
        path is tested against."""
        overlaps = self._overlaps(request)
        rows = [self._row(request, w, overlaps) for w in self._table.workers(request.model)]
        ranked = self._ranked([r for r in rows if r.eligible and r.busy is None])
        rest = sorted(
            (r for r in rows if not (r.eligible and r.busy is None)),
            key=lambda r: (not r.eligible, r.worker.key),
        )
        if ranked:
            outcome, reason = Outcome.ROUTE, ""
        elif any(r.eligible for r in rows):
            outcome, reason = Outcome.QUEUE, self._busy_message(request)
        else:
            outcome, reason = Outcome.NO_WORKER, self._unsatisfiable(request)
        depth = self._queue.depth(request.model)
        return Explanation(request, outcome, (*ranked, *rest), reason, depth)

    # -- choosing

    def _rank(self, worker: WorkerRecord) -> float | None:
        """The worker's place in its group's order: its load's rank, None when busy."""
        load = self._loads.get(worker.key, IDLE)
        card = worker.model_card
        if load.busy(card, self.config.queue_threshold) is not None:
            return None
        if self._reported.busy(worker.key) is not None:
            return None
        return load_rank(self.config, card.kv_block_size, load)

    def _choose(self, request: RouteRequest, groups: tuple[Group, ...]) -> Pick | None:
        if not groups:
            return None
        return self._chooser.choose(request, groups, self._overlaps(request))

    def _busy(self, worker: WorkerRecord) -> Busy | None:
        """Why ``worker`` takes no new request now: its load here, or its engine's report."""
        own = self.load(worker.key).busy(worker.model_card, self.config.queue_threshold)
        return own or self._reported.busy(worker.key)

    def _describe_busy(self, worker: WorkerRecord) -> str:
        reported = self._reported.get(worker.key)
        if self._reported.busy(worker.key) is not None and reported is not None:
            return describe(reported)
        return self.load(worker.key).describe_busy(worker.model_card, self.config.queue_threshold)

    def _overlaps(self, request: RouteRequest) -> dict[str, int]:
        if self.config.overlap_score_credit == 0 or not request.block_hashes:
            return {}
        return dict(self._prefix.overlaps(request.block_hashes))

    def _assign(self, request: RouteRequest, pick: Pick, waited: float) -> Assignment:
        worker = pick.group.members[pick.key]
        terms = cost_terms(
            self.config,
            pick.group.block_size,
            self.load(pick.key),
            prompt_tokens=request.prompt_tokens,
            overlap_blocks=pick.overlap,
            preference=pick.preference,
        )
        ticket = self._reserve(worker, request, terms)
        if self.config.overlap_score_credit > 0 and request.block_hashes:
            self._prefix.record(pick.key, request.block_hashes)
        return Assignment(worker, waited, terms, ticket)

    def _terms(
        self, request: RouteRequest, worker: WorkerRecord, load: Load, overlap: int
    ) -> CostTerms:
        constraints = request.constraints
        weight = preference(worker.taints, constraints) if constraints.preferred_taints else 0.0
        return cost_terms(
            self.config,
            worker.model_card.kv_block_size,
            load,
            prompt_tokens=request.prompt_tokens,
            overlap_blocks=overlap,
            preference=weight,
        )

    def _reserve(self, worker: WorkerRecord, request: RouteRequest, terms: CostTerms) -> int:
        """Hold the request's load on ``worker``; return the ticket that names it."""
        # The cached prefix is not prefilled again (Dynamo's assume-kv-reuse).
        cached = terms.overlap_blocks * worker.model_card.kv_block_size
        held = _Reservation(worker.key, max(0, request.prompt_tokens - cached), terms.new_blocks)
        load = self._loads.get(worker.key, IDLE)
        self._loads[worker.key] = load.plus(held.prefill_tokens, held.kv_blocks)
        self._table.rerank(worker.key)
        self._changed(worker.key)
        ticket = next(self._tickets)
        self._held[ticket] = held
        return ticket

    def _unload(self, key: str, amount: Load) -> None:
        load = self._loads[key].minus(amount)
        if load.idle:
            del self._loads[key]
        else:
            self._loads[key] = load
        self._table.rerank(key)
        self._changed(key)

    # -- waiting

    async def _park(self, request: RouteRequest, state: WaitState) -> Assignment:
        loop = asyncio.get_running_loop()
        waiter = Waiter(request, state, loop.time(), loop.create_future())
        deadline = waiter.deadline(self.config)
        if deadline is not None and deadline <= waiter.enqueued:
            raise self._give_up(waiter, waited=False)
        if self._queue.full:
            self._metrics.decided(request.model, "queue_full")
            raise QueueFullError(
                f"the pending queue is full ({self._queue.capacity} requests waiting); "
                f"request for model {request.model!r} not queued: {self._situation(waiter)}"
            )
        self._queue.push(waiter)
        return await self._wait(waiter)

    async def _wait(self, waiter: Waiter) -> Assignment:
        """Await the waiter's future under its deadline; always leaves the queue clean."""
        future = waiter.future
        try:
            async with asyncio.timeout_at(waiter.deadline(self.config)) as waiter.timeout:
                return await future
        except TimeoutError:
            if waiter.timeout is None or not waiter.timeout.expired():
                raise
            if future.done() and not future.cancelled() and future.exception() is None:
                return future.result()  # dispatched in the same instant the deadline hit
            raise self._give_up(waiter, waited=True) from None
        except asyncio.CancelledError:
            self._abandon(waiter)
            raise
        finally:
            self._queue.remove(waiter)

    def _abandon(self, waiter: Waiter) -> None:
        """The waiting task was cancelled: undo a dispatch it will never see."""
        future = waiter.future
        if future.cancelled():
            self._metrics.decided(waiter.model, "cancelled")
            self._metrics.wait.labels(outcome="cancelled").observe(self._waited(waiter))
        elif future.exception() is None:  # also marks a failure as retrieved
            self.release(future.result())

    def _head(self, case: Case) -> Waiter | None:
        """The case's first waiter still waiting. A cancelled one leaves the queue here
        rather than when its task next runs, so it holds up nobody behind it."""
        while case.waiters:
            waiter = case.head()
            if waiter.pending:
                return waiter
            self._queue.remove(waiter)
        return None

    def _recheck(self, model: str, moved: tuple[Group | None, Group | None] | None = None) -> None:
        """Offer workers to the waiters of ``model``, case by case in arrival order.

        A dispatch only adds load, so once a case found no free worker, its later waiters
        cannot find one either: one decision per case answers for all of them. When one
        worker changed (``moved``: the group it left and the one it joined, either None),
        only the cases that admit one of those groups can see a difference; the others
        keep their workers, their loads and so their situation.
        """
        cases = self._queue.cases(model)
        if not cases:
            return
        for case, waiter in self._by_arrival(cases if moved is None else _affected(cases, moved)):
            started = time.perf_counter()
            request = waiter.request
            groups = self._table.eligible_groups(model, case.required, case.needs)
            pick = self._choose(request, groups)
            if pick is None:
                eligible = _any_member(groups, case.exclude)
                self._judge(case, WaitState.BUSY if eligible else WaitState.NO_WORKER)
                continue
            self._dispatch(waiter, self._assign(request, pick, self._waited(waiter)), started)

    def _offer_worker(self, key: str) -> None:
        """Offer one worker whose load went down to the waiting cases it suits, in order.

        By the invariant, every other eligible worker of every waiter is still busy, so
        this worker is the only possible dispatch and no full re-check is needed.
        """
        group = self._table.group_of(key) if self._queue else None
        if group is None or key not in group.free:
            return
        cases = self._queue.cases(group.model)
        suited = [c for c in cases if group.admits(c.required, c.needs) and key not in c.exclude]
        for _, waiter in self._by_arrival(suited):
            if key not in group.free:
                return  # busy again
            started = time.perf_counter()
            request = waiter.request
            overlap = self._overlaps(request).get(key, 0)
            weight = preference(group.taints, request.constraints)
            pick = Pick(group, key, overlap, weight, 0.0)
            self._dispatch(waiter, self._assign(request, pick, self._waited(waiter)), started)

    def _by_arrival(self, cases: Iterable[Case]) -> Iterator[tuple[Case, Waiter]]:
        """The first waiter of each case, earliest first; once the caller has dispatched
        (or failed) it, the next waiter of its case takes its place in the order."""
        heap = by_arrival(cases)
        while heap:
            case = heapq.heappop(heap)[2]
            waiter = self._head(case)
            if waiter is None:
                continue
            yield case, waiter
            if not waiter.pending and case.waiters:
                heapq.heappush(heap, (case.head().seq, id(case), case))

    def _judge(self, case: Case, state: WaitState) -> None:
        """A case's situation may have changed: fail its waiters, or move their deadlines."""
        if state is case.state:
            return
        case.state = state
        for waiter in list(case.waiters.values()):
            if waiter.pending:
                self._rejudge(waiter, state)

    def _rejudge(self, waiter: Waiter, state: WaitState) -> None:
        waiter.state = state
        window = self.config.settle_window
        now = waiter.future.get_loop().time()
        waiter.settle_until = now + window if state is WaitState.NO_WORKER and window else None
        if state is WaitState.NO_WORKER and self._spent(waiter, now):
            error = NoEligibleWorkerError(self._unsatisfiable(waiter.request))
            self._fail(waiter, error, "no_worker")
            return
        waiter.move_deadline(self.config)

    def _dispatch(self, waiter: Waiter, assignment: Assignment, started: float) -> None:
        self._queue.remove(waiter)
        waiter.future.set_result(assignment)
        self._metrics.decided(waiter.model, "dispatched", time.perf_counter() - started)
        self._metrics.wait.labels(outcome="dispatched").observe(assignment.waited)

    def _fail(self, waiter: Waiter, error: RoutingError, outcome: str) -> None:
        self._queue.remove(waiter)
        waiter.future.set_exception(error)
        self._metrics.decided(waiter.model, outcome)
        self._metrics.wait.labels(outcome=outcome).observe(self._waited(waiter))

    def _spent(self, waiter: Waiter, now: float) -> bool:
        """Whether the waiter's limit for its current state has already passed."""
        deadline = waiter.deadline(self.config)
        return deadline is not None and deadline <= now

    @staticmethod
    def _waited(waiter: Waiter) -> float:
        return waiter.future.get_loop().time() - waiter.enqueued

    # -- saying why

    def _give_up(self, waiter: Waiter, *, waited: bool) -> RoutingError:
        """The error for a request whose wait is over (or was zero), with its metric."""
        request = waiter.request
        if waited and waiter.settling(self.config):
            self._metrics.decided(request.model, "no_worker")
            self._metrics.wait.labels(outcome="no_worker").observe(self._waited(waiter))
            return NoEligibleWorkerError(
                f"{self._unsatisfiable(request)} (waited {self._waited(waiter):.3g} s: its "
                f"last eligible worker stopped qualifying, and no other did within the "
                f"{self.config.settle_window:g} s settle window)"
            )
        if not waited and waiter.state is WaitState.NO_WORKER:
            self._metrics.decided(request.model, "no_worker")
            return NoEligibleWorkerError(self._unsatisfiable(request))
        self._metrics.decided(request.model, "timeout")
        if waited:
            self._metrics.wait.labels(outcome="timeout").observe(self._waited(waiter))
        spent = self._waited(waiter) if waited else 0.0
        return QueueTimeoutError(
            f"request for model {request.model!r} waited {spent:.3g} s, its limit, "
            f"without a worker: {self._situation(waiter)}"
        )

    def _situation(self, waiter: Waiter) -> str:
        if waiter.state is WaitState.BUSY:
            return self._busy_message(waiter.request)
        return self._unsatisfiable(waiter.request)

    def _unsatisfiable(self, request: RouteRequest) -> str:
        return self._table.unsatisfiable(
            request.model, request.constraints, request.exclude, request.needs
        )

    def _busy_message(self, request: RouteRequest) -> str:
        """``all 2 workers of model 'm' with capacity/fast are busy: a1 runs 1 of 1 ...``."""
        required = request.constraints.required_taints
        groups = self._table.eligible_groups(request.model, required, request.needs)
        exclude = request.exclude
        eligible = (w for g in groups for k, w in g.members.items() if k not in exclude)
        shown = [
            f"{w.instance_id} {self._describe_busy(w)}"
            for w in itertools.islice(eligible, MESSAGE_WORKERS)
        ]
        total = sum(len(g.members) for g in groups) - sum(
            1 for key in exclude if any(key in g.members for g in groups)
        )
        more = total - len(shown)
        tail = f", and {more} more" if more > 0 else ""
        with_ = f" with {' and '.join(sorted(required))}" if required else ""
        count = f"{total} worker{'s' if total != 1 else ''}"
        return f"all {count} of model {request.model!r}{with_} are busy: {', '.join(shown)}{tail}"

    def _refuse_if_closed(self, request: RouteRequest) -> None:
        if self._closed:
            self._metrics.decided(request.model, "shutdown")
            raise self._shutting_down(request)

    @staticmethod
    def _shutting_down(request: RouteRequest) -> ShuttingDownError:
        return ShuttingDownError(
            f"the router is shutting down; request for model {request.model!r} was not routed"
        )

    # -- explaining

    def _row(
        self, request: RouteRequest, worker: WorkerRecord, overlaps: dict[str, int]
    ) -> WorkerExplanation:
        load = self.load(worker.key)
        why = why_not(worker, request.constraints, request.exclude, request.needs)
        busy = self._busy(worker)
        terms = self._terms(request, worker, load, overlaps.get(worker.key, 0))
        return WorkerExplanation(worker, why, busy, load, terms, self._prefix.source(worker.key))

    def _ranked(self, rows: Iterable[WorkerExplanation]) -> list[WorkerExplanation]:
        """Candidates by cost, each with its chance of being picked: at temperature > 0
        only the ``sample_candidates`` cheapest have one (``choice.py``)."""
        order = sorted(rows, key=lambda r: r.terms.cost)
        temperature = self.config.temperature
        sampled = order if temperature == 0.0 else order[: self.config.sample_candidates]
        chances = probabilities([r.terms.cost for r in sampled], temperature)
        chances += [0.0] * (len(order) - len(sampled))
        return [
            replace(row, rank=n, probability=chance)
            for n, (row, chance) in enumerate(zip(order, chances, strict=True), 1)
        ]


def _affected(cases: list[Case], moved: tuple[Group | None, Group | None]) -> list[Case]:
    """The cases that may use a worker of one of the ``moved`` groups."""
    groups = [g for g in moved if g is not None]
    return [c for c in cases if any(g.admits(c.required, c.needs) for g in groups)]


def _any_member(groups: Iterable[Group], exclude: Collection[str]) -> bool:
    """Whether ``groups`` hold a worker that ``exclude`` does not name. A group larger than
    the exclusions certainly does, so this looks at no more workers than are excluded."""
    return any(
        len(g.members) > len(exclude) or any(k not in exclude for k in g.members) for g in groups
    )
