"""The router: picks a worker for each request, and parks the ones no worker can take yet.

Use::

    router = Router(RouterConfig(), registry=registry)
    router.apply(event)                     # every discovery event, as it arrives
    async with router.route(request) as assignment:
        ...                                 # send it to assignment.worker.address
        router.prefill_done(assignment)     # optional, on the first token
    router.close()                          # at shutdown: waiting requests fail

The contract:

* ``route`` / ``acquire`` assigns at once when an eligible worker is not busy (cost and
  selection in ``scoring.py``). When eligible workers exist but all are busy, the request
  waits, first come first served. When none exists it fails at once with
  ``NoEligibleWorkerError``, or waits up to ``config.no_worker_wait``. A request's
  ``max_wait`` replaces both limits. A full queue raises ``QueueFullError``, the end of a
  wait ``QueueTimeoutError``, a closed router ``ShuttingDownError``.
* Every change re-checks the waiting requests, synchronously, inside the call that made it:
  ``apply`` (any discovery event, a taint update included), ``release`` and
  ``prefill_done``. No polling, no sleep. Invariant after every call: no waiting request
  has an eligible worker that is not busy. So a newcomer that finds a free worker takes
  nothing a waiting request could use, and arrival order holds.
* A waiter dispatched that way has its worker reserved at that moment;
  ``Assignment.waited`` says how long it waited. A waiter whose situation changes is judged
  again: with no eligible worker left and its no-worker limit already spent, it fails
  with ``NoEligibleWorkerError``, as a new request would.
* Load is what this router has in flight per worker, reserved when the worker is chosen
  and given back by ``release`` (idempotent; ``route`` calls it on exit).
* What a worker's engine reports (``report``) enters only whether it is busy: a worker is
  busy while its engine reports requests waiting in its own queue, or reports itself
  unhealthy (``reported.py``); the report that frees it dispatches waiting requests.
* Single-threaded: call everything from the event loop's thread. The router owns no task.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections.abc import AsyncIterator, Collection, Iterable
from dataclasses import dataclass, replace

from prometheus_client import CollectorRegistry

from dynamod.errors import (
    NoEligibleWorkerError,
    QueueFullError,
    QueueTimeoutError,
    RoutingError,
    ShuttingDownError,
)
from dynamod.load import IDLE, Busy, Load
from dynamod.model import DiscoveryEvent, ModelCard, WorkerRecord
from dynamod.reported import EngineLoad
from dynamod.router.config import RouterConfig
from dynamod.router.metrics import RouterMetrics
from dynamod.router.prefix import PrefixIndex
from dynamod.router.queue import PendingQueue, Waiter, WaitState
from dynamod.router.reported import ReportedLoads, describe
from dynamod.router.scoring import CostTerms, cost_terms, probabilities, select
from dynamod.router.table import MESSAGE_WORKERS, RoutingTable, why_not
from dynamod.router.types import (
    Assignment,
    Explanation,
    Outcome,
    RouteRequest,
    WorkerExplanation,
)
from dynamod.taints import RoutingConstraints, preference

_Candidate = tuple[str, WorkerRecord, Load]
"""An eligible, non-busy worker: its key, its record, its load."""


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
    receives the metrics (a fresh ``CollectorRegistry`` when none is given).
    """

    def __init__(
        self,
        config: RouterConfig | None = None,
        *,
        rng: random.Random | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.config = config if config is not None else RouterConfig()
        self.registry = registry if registry is not None else CollectorRegistry()
        self._rng = rng if rng is not None else random.Random()
        self._table = RoutingTable()
        self._loads: dict[str, Load] = {}
        self._held: dict[int, _Reservation] = {}
        self._tickets = itertools.count()
        self._prefix = PrefixIndex(self.config.prefix_ttl, self.config.prefix_capacity)
        self._metrics = RouterMetrics(self.registry)
        self._queue = PendingQueue(self.config.max_queue, self._metrics.depth_changed)
        self._reported = ReportedLoads()
        self._closed = False

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
        """The model card of ``model``'s workers, or None when no worker serves it."""
        return self._table.card(model)

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
        if self._reported.set(key, load):
            self._offer_worker(key)

    def apply(self, event: DiscoveryEvent) -> None:
        """Fold a discovery event into the table, then re-check the affected waiters."""
        for model in self._table.apply(event):
            self._recheck(model)

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
        free, eligible = self._candidates(request)
        if free:
            assignment = self._assign(request, free, waited=0.0)
            self._metrics.decided(request.model, "routed", time.perf_counter() - started)
            return assignment
        state = WaitState.BUSY if eligible else WaitState.NO_WORKER
        return await self._park(request, state)

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

    def reconfigure(self, config: RouterConfig) -> None:
        """Take new knobs (a SIGHUP reload). Waiting requests keep their deadlines; the
        prefix index keeps the TTL and capacity it was built with until a restart."""
        self.config = config
        self._queue.capacity = config.max_queue

    def close(self) -> None:
        """Refuse new requests and fail every waiting one with ``ShuttingDownError``."""
        self._closed = True
        for waiter in self._queue:
            if waiter.pending:
                self._fail(waiter, self._shutting_down(waiter.request), "shutdown")

    def explain(self, request: RouteRequest) -> Explanation:
        """What ``route`` would do now, worker by worker, with every cost term."""
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

    def _candidates(self, request: RouteRequest) -> tuple[list[_Candidate], bool]:
        """(eligible workers that are not busy, with their loads; whether any is eligible)."""
        items = self._table.eligible_items(request.model, request.constraints, request.exclude)
        loads, threshold = self._loads, self.config.queue_threshold
        reported = self._reported
        free = [
            (key, w, load)
            for key, w in items
            if (load := loads.get(key, IDLE)).busy(w.model_card, threshold) is None
            and reported.busy(key) is None
        ]
        return free, bool(items)

    def _busy(self, worker: WorkerRecord) -> Busy | None:
        own = self.load(worker.key).busy(worker.model_card, self.config.queue_threshold)
        return own or self._reported.busy(worker.key)

    def _describe_busy(self, worker: WorkerRecord) -> str:
        reported = self._reported.get(worker.key)
        if self._reported.busy(worker.key) is not None and reported is not None:
            return describe(reported)
        return self.load(worker.key).describe_busy(worker.model_card, self.config.queue_threshold)

    def _assign(
        self, request: RouteRequest, candidates: list[_Candidate], *, waited: float
    ) -> Assignment:
        terms = self._costs(request, candidates)
        chosen = select([t.cost for t in terms], self.config.temperature, self._rng)
        key, worker, _ = candidates[chosen]
        ticket = self._reserve(worker, request, terms[chosen])
        if self.config.overlap_score_credit > 0:
            self._prefix.record(key, request.block_hashes)
        return Assignment(worker, waited, terms[chosen], len(candidates), ticket)

    def _costs(self, request: RouteRequest, candidates: list[_Candidate]) -> list[CostTerms]:
        """The cost terms of each candidate.

        Only a worker's block size, load, prefix overlap and taints enter its cost, so each
        distinct combination is computed once: in a mostly idle fleet a decision costs a
        few evaluations of the formula, not one per worker. Loads are keyed by identity
        (cheap; all idle workers share ``IDLE``), which can only miss a reuse, never
        confuse two loads: each one is alive for the whole decision.
        """
        overlaps = self._overlaps(request)
        memo: dict[tuple[int, int, int, tuple[str, ...]], CostTerms] = {}
        costs = []
        for key, worker, load in candidates:
            overlap = overlaps.get(key, 0) if overlaps else 0
            case = (worker.model_card.kv_block_size, id(load), overlap, worker.taints)
            terms = memo.get(case)
            if terms is None:
                terms = memo[case] = self._terms(request, worker, load, overlap)
            costs.append(terms)
        return costs

    def _overlaps(self, request: RouteRequest) -> dict[str, int]:
        if self.config.overlap_score_credit == 0 or not request.block_hashes:
            return {}
        return self._prefix.overlaps(request.block_hashes)

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
        ticket = next(self._tickets)
        self._held[ticket] = held
        return ticket

    def _unload(self, key: str, amount: Load) -> None:
        load = self._loads[key].minus(amount)
        if load.idle:
            del self._loads[key]
        else:
            self._loads[key] = load

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

    def _recheck(self, model: str) -> None:
        """Offer workers to every waiter of ``model``, in arrival order.

        A dispatch only adds load, so once some constraints found no free worker, later
        waiters with the same constraints cannot find one either: they reuse that answer,
        and a long queue of alike requests costs one eligibility check, not one each.
        """
        blocked: dict[tuple[frozenset[str], Collection[str]], bool] = {}
        for waiter in self._queue.waiting(model):
            if waiter.pending:
                self._offer(waiter, blocked)

    def _offer(
        self, waiter: Waiter, blocked: dict[tuple[frozenset[str], Collection[str]], bool]
    ) -> None:
        """Dispatch one waiter if a worker is free for it, else re-judge its wait."""
        request = waiter.request
        case = (request.constraints.required_taints, request.exclude)
        eligible = blocked.get(case)
        if eligible is None:
            started = time.perf_counter()
            free, eligible = self._candidates(request)
            if free:
                assignment = self._assign(request, free, waited=self._waited(waiter))
                self._dispatch(waiter, assignment, started)
                return
            blocked[case] = eligible
        self._judge(waiter, WaitState.BUSY if eligible else WaitState.NO_WORKER)

    def _judge(self, waiter: Waiter, state: WaitState) -> None:
        """A waiter's situation may have changed: fail it, or move its deadline."""
        if state is waiter.state:
            return
        waiter.state = state
        if state is WaitState.NO_WORKER and self._spent(waiter):
            error = NoEligibleWorkerError(self._unsatisfiable(waiter.request))
            self._fail(waiter, error, "no_worker")
            return
        waiter.move_deadline(self.config)

    def _offer_worker(self, key: str) -> None:
        """Offer one worker whose load went down to the waiters of its model, in order.

        By the invariant, every other eligible worker of every waiter is still busy, so
        this worker is the only possible dispatch and no full re-check is needed.
        """
        worker = self._table.get(key)
        if worker is None:
            return
        for waiter in self._queue.waiting(worker.model):
            if self._busy(worker) is not None:
                return
            request = waiter.request
            if waiter.pending and why_not(worker, request.constraints, request.exclude) is None:
                started = time.perf_counter()
                candidate = [(key, worker, self.load(key))]
                assignment = self._assign(request, candidate, waited=self._waited(waiter))
                self._dispatch(waiter, assignment, started)

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

    def _spent(self, waiter: Waiter) -> bool:
        """Whether the waiter's limit for its current state has already passed."""
        deadline = waiter.deadline(self.config)
        return deadline is not None and deadline <= waiter.future.get_loop().time()

    @staticmethod
    def _waited(waiter: Waiter) -> float:
        return waiter.future.get_loop().time() - waiter.enqueued

    # -- saying why

    def _give_up(self, waiter: Waiter, *, waited: bool) -> RoutingError:
        """The error for a request whose wait is over (or was zero), with its metric."""
        request = waiter.request
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
        return self._table.unsatisfiable(request.model, request.constraints, request.exclude)

    def _busy_message(self, request: RouteRequest) -> str:
        """``all 2 workers of model 'm' with capacity/fast are busy: a1 runs 1 of 1 ...``."""
        eligible = self._table.eligible(request.model, request.constraints, request.exclude)
        shown = [f"{w.instance_id} {self._describe_busy(w)}" for w in eligible[:MESSAGE_WORKERS]]
        more = len(eligible) - MESSAGE_WORKERS
        tail = f", and {more} more" if more > 0 else ""
        required = sorted(request.constraints.required_taints)
        with_ = f" with {' and '.join(required)}" if required else ""
        count = f"{len(eligible)} worker{'s' if len(eligible) != 1 else ''}"
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
        why = why_not(worker, request.constraints, request.exclude)
        busy = self._busy(worker)
        terms = self._terms(request, worker, load, overlaps.get(worker.key, 0))
        return WorkerExplanation(worker, why, busy, load, terms)

    def _ranked(self, rows: Iterable[WorkerExplanation]) -> list[WorkerExplanation]:
        rows = list(rows)
        chances = probabilities([r.terms.cost for r in rows], self.config.temperature)
        order = sorted(range(len(rows)), key=lambda i: rows[i].terms.cost)
        return [replace(rows[i], rank=n, probability=chances[i]) for n, i in enumerate(order, 1)]
