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
  waits up to ``knobs.no_worker_wait``. A request's ``max_wait`` replaces both limits. A
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
  removal), it keeps waiting for ``knobs.settle_window`` for another worker to qualify
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
  unhealthy (``saturation.py``); the report that frees it dispatches waiting requests.
* ``watch(callback)``: ``callback(key)`` after every change of the load on a worker or of
  its engine's report, inside the call that made it (a drain waits on these, not on a
  timer: ``dynamod/drain_watch.py``); ``watch_queue(callback)``: ``callback(model,
  depth)`` after every change of a model's number of waiting requests.
* Single-threaded: call everything from the event loop's thread. The router owns no task.

The router is a facade over three parts: the load it holds on each worker
(``reservations.py``), the requests waiting for one (``waiting.py``) and the operator's
view of a decision (``explain.py``); the decision itself, which worker a request gets, is
here.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import time
from collections.abc import AsyncIterator, Callable

from prometheus_client import CollectorRegistry

from dynamod.discovery_events import DiscoveryEvent, ViewResync
from dynamod.engine_events import EngineLoad
from dynamod.load import Busy, Load
from dynamod.records import ModelCard, WorkerRecord
from dynamod.router import explain as explaining
from dynamod.router.choice import Chooser, Pick
from dynamod.router.dissent import Dissent
from dynamod.router.fit import ModelReading
from dynamod.router.groups import Group
from dynamod.router.knobs import RouterKnobs
from dynamod.router.prefix import OverlapSource, PrefixIndex
from dynamod.router.queue import WaitState
from dynamod.router.reservations import Reservations
from dynamod.router.router_metrics import RouterMetrics
from dynamod.router.saturation import ReportedLoads, describe
from dynamod.router.scoring import cost_terms, load_rank
from dynamod.router.table import MESSAGE_WORKERS, RoutingTable
from dynamod.router.types import Assignment, Explanation, RouteRequest
from dynamod.router.waiting import Waiting, any_member, shutting_down
from dynamod.taints import RoutingConstraints


class Router:
    """Routes requests over the workers it learns from ``apply``; see the module docstring.

    ``rng`` drives tie-breaks and sampling (seed it for reproducible tests); ``registry``
    receives the metrics (a fresh ``CollectorRegistry`` when none is given); ``overlaps``
    says which workers hold a prompt's leading blocks (by default a ``PrefixIndex`` of what
    this router sent, sized by the knobs).
    """

    def __init__(
        self,
        knobs: RouterKnobs | None = None,
        *,
        rng: random.Random | None = None,
        registry: CollectorRegistry | None = None,
        overlaps: OverlapSource | None = None,
    ) -> None:
        self.knobs = knobs if knobs is not None else RouterKnobs()
        self.registry = registry if registry is not None else CollectorRegistry()
        self._rng = rng if rng is not None else random.Random()
        self._table = RoutingTable(ranker=self._rank)
        self._chooser = Chooser(self.knobs, self._rng, self._table.group_of)
        self._reservations = Reservations(self._changed)
        self.prefix: OverlapSource = (
            overlaps
            if overlaps is not None
            else PrefixIndex(self.knobs.prefix_ttl, self.knobs.prefix_capacity)
        )
        """Which workers hold a prompt's leading blocks (``prefix.py``, ``kvindex.py``)."""
        self._metrics = RouterMetrics(self.registry)
        self._waiting = Waiting(self, self._metrics, self._depth_changed)
        self._reported = ReportedLoads()
        self._dissent = Dissent(self._table, self._metrics.disagreeing)
        self._closed = False
        self._watchers: list[Callable[[str], None]] = []
        self._queue_watchers: list[Callable[[str, int], None]] = []

    @property
    def table(self) -> RoutingTable:
        """The worker view (read it; change it only through ``apply``)."""
        return self._table

    @property
    def queue_depth(self) -> int:
        """Requests waiting now, all models."""
        return len(self._waiting.queue)

    @property
    def closed(self) -> bool:
        return self._closed

    def depth(self, model: str) -> int:
        return self._waiting.queue.depth(model)

    def card(self, model: str) -> ModelCard | None:
        """A model card of ``model``'s workers, of the reading most of them publish; None
        when no worker serves it."""
        return self._table.card(model)

    def reading(self, model: str) -> ModelReading | None:
        """How requests for ``model`` are read (``fit.py``); None when no worker serves it."""
        return self._table.reading(model)

    def disagreement(self, record: WorkerRecord) -> str:
        """Why ``record``'s worker is left out of routing for its reading, or ""."""
        return self._table.disagreement(record)

    def unserved(self, model: str) -> str:
        """The sentence for a request naming a model no worker serves."""
        return self._table.unsatisfiable(model, RoutingConstraints())

    def load(self, key: str) -> Load:
        """What this router has in flight on the worker ``key``."""
        return self._reservations.load(key)

    def in_flight(self) -> dict[str, int]:
        """What this router has in flight, by worker key (workers with none left out)."""
        return self._reservations.in_flight()

    def waiting_for(self) -> dict[frozenset[str], int]:
        """Requests waiting in this router's queue, by the taints they require."""
        return self._waiting.queue.required()

    def reported(self, key: str) -> EngineLoad | None:
        """What the worker ``key``'s engine last reported, if anything is known."""
        return self._reported.get(key)

    def report(self, key: str, load: EngineLoad | None) -> None:
        """What the worker ``key``'s engine says now (None: nothing known any more)."""
        freed = self._reported.set(key, load)
        self._changed(key)
        if freed:
            self._waiting.offer(key)

    def watch(self, watcher: Callable[[str], None]) -> Callable[[], None]:
        """Call ``watcher(key)`` after every change of this router's load on the worker
        ``key`` or of its engine's report; returns the way to stop. It runs inside the call
        that made the change, so it must be quick and must not raise."""
        self._watchers.append(watcher)
        return lambda: self._watchers.remove(watcher)

    def watch_queue(self, watcher: Callable[[str, int], None]) -> Callable[[], None]:
        """Call ``watcher(model, depth)`` after every change of the number of requests for
        ``model`` waiting in this router's queue (a request joined it, or left it); returns
        the way to stop. It runs inside the call that made the change: quick, no raising."""
        self._queue_watchers.append(watcher)
        return lambda: self._queue_watchers.remove(watcher)

    def apply(self, event: DiscoveryEvent) -> None:
        """Fold a discovery event into the table, then re-check the affected waiters."""
        if isinstance(event, ViewResync):
            for model in self._table.apply(event):
                self._waiting.recheck(model)
                self._dissent.check(model)
            return
        key = event.record.key
        before = self._table.group_of(key)
        for model in self._table.apply(event):
            self._waiting.recheck(model, (before, self._table.group_of(key)))
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
        if self._closed:
            self._metrics.decided(request.model, "shutdown")
            raise shutting_down(request)
        started = time.perf_counter()
        required = request.constraints.required_taints
        groups = self._table.eligible_groups(request.model, required, request.needs)
        pick = self.pick(request, groups)
        if pick is not None:
            assignment = self.assign(request, pick, 0.0)
            self._metrics.decided(request.model, "routed", time.perf_counter() - started)
            return assignment
        state = WaitState.BUSY if any_member(groups, request.exclude) else WaitState.NO_WORKER
        return await self._waiting.park(request, state)

    def release(self, assignment: Assignment) -> None:
        """Give the assignment's load back and offer its worker to the waiters. Idempotent."""
        key = self._reservations.release(assignment.ticket)
        if key is not None:
            self._waiting.offer(key)

    def prefill_done(self, assignment: Assignment) -> None:
        """The worker finished the prompt: its prefill tokens stop counting. Idempotent."""
        key = self._reservations.prefill_done(assignment.ticket)
        if key is not None:
            self._waiting.offer(key)

    def reconfigure(self, knobs: RouterKnobs) -> None:
        """Take new knobs (a SIGHUP reload). Waiting requests keep their deadlines; the
        prefix index keeps the TTL and capacity it was built with until a restart. New
        weights or busy thresholds re-rank every worker, and may free some for waiters."""
        self.knobs = knobs
        self._chooser.knobs = knobs
        self._waiting.queue.capacity = knobs.max_queue
        self._table.rerank()
        for model in self._table.models():
            self._waiting.recheck(model)

    def close(self) -> None:
        """Refuse new requests and fail every waiting one with ``ShuttingDownError``."""
        self._closed = True
        self._waiting.close()

    def explain(self, request: RouteRequest) -> Explanation:
        """What ``route`` would do now, worker by worker, with every cost term
        (``explain.py``)."""
        return explaining.explain(self, request)

    # -- deciding (for the waiting requests and the explanation too)

    def pick(self, request: RouteRequest, groups: tuple[Group, ...]) -> Pick | None:
        """The worker of ``groups`` that ``request`` gets now, if one is free."""
        if not groups:
            return None
        return self._chooser.choose(request, groups, self.overlaps(request))

    def assign(self, request: RouteRequest, pick: Pick, waited: float) -> Assignment:
        """Reserve ``pick``'s worker for ``request``: the assignment that holds it."""
        worker = pick.group.members[pick.key]
        terms = cost_terms(
            self.knobs,
            pick.group.block_size,
            self.load(pick.key),
            prompt_tokens=request.prompt_tokens,
            overlap_blocks=pick.overlap,
            preference=pick.preference,
        )
        ticket = self._reservations.hold(worker, request.prompt_tokens, terms)
        if self.knobs.overlap_score_credit > 0 and request.block_hashes:
            self.prefix.record(pick.key, request.block_hashes)
        return Assignment(worker, waited, terms, ticket)

    def overlaps(self, request: RouteRequest) -> dict[str, int]:
        """Blocks of ``request``'s prompt each worker is known to hold."""
        if self.knobs.overlap_score_credit == 0 or not request.block_hashes:
            return {}
        return dict(self.prefix.overlaps(request.block_hashes))

    def busy(self, worker: WorkerRecord) -> Busy | None:
        """Why ``worker`` takes no new request now: its load here, or its engine's report."""
        own = self.load(worker.key).busy(worker.model_card, self.knobs.queue_threshold)
        return own or self._reported.busy(worker.key)

    def unsatisfiable(self, request: RouteRequest) -> str:
        return self._table.unsatisfiable(
            request.model, request.constraints, request.exclude, request.needs
        )

    def busy_message(self, request: RouteRequest) -> str:
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

    # -- inside

    def _rank(self, worker: WorkerRecord) -> float | None:
        """The worker's place in its group's order: its load's rank, None when busy."""
        load = self.load(worker.key)
        card = worker.model_card
        if load.busy(card, self.knobs.queue_threshold) is not None:
            return None
        if self._reported.busy(worker.key) is not None:
            return None
        return load_rank(self.knobs, card.kv_block_size, load)

    def _changed(self, key: str) -> None:
        """The load on worker ``key`` or its engine's report changed: re-rank it, tell the
        watchers."""
        self._table.rerank(key)
        for watcher in tuple(self._watchers):
            watcher(key)

    def _depth_changed(self, model: str, depth: int) -> None:
        self._metrics.depth_changed(model, depth)
        for watcher in tuple(self._queue_watchers):
            watcher(model, depth)

    def _describe_busy(self, worker: WorkerRecord) -> str:
        reported = self._reported.get(worker.key)
        if self._reported.busy(worker.key) is not None and reported is not None:
            return describe(reported)
        return self.load(worker.key).describe_busy(worker.model_card, self.knobs.queue_threshold)
