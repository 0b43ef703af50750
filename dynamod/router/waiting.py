"""Requests waiting for a worker: parked first come first served, re-checked on every change.

``park(request, state)`` queues a request no worker can take now and awaits its worker (or
its error) under its deadline. Every change of the router (a discovery event, a load going
down, a report freeing a worker, new knobs) calls ``recheck(model)`` or
``offer(key)`` synchronously, so waiting requests are dispatched inside the call that made
a worker available: no polling, no sleep. The invariant after every call: no waiting
request has an eligible worker that is not busy.

Waiters are kept in cases (``queue.py``): re-checking costs one decision per case of
waiters that ask for the same workers, plus one per waiter dispatched or whose situation
changes. A waiter whose last eligible worker stopped qualifying keeps waiting for
``settle_window`` seconds for another one (a remove-then-add move), then fails.

The decisions themselves are the router's (``Decider``): which worker, the reservation,
the sentences that say why not.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Protocol

from dynamod.errors import (
    NoEligibleWorkerError,
    QueueFullError,
    QueueTimeoutError,
    RoutingError,
    ShuttingDownError,
)
from dynamod.router.choice import Pick
from dynamod.router.groups import Group
from dynamod.router.knobs import RouterKnobs
from dynamod.router.queue import Case, PendingQueue, Waiter, WaitState, by_arrival
from dynamod.router.router_metrics import RouterMetrics
from dynamod.router.table import RoutingTable
from dynamod.router.types import Assignment, RouteRequest
from dynamod.taints import preference


class Decider(Protocol):
    """What waiting needs of the router: its knobs and table, its decisions and words."""

    knobs: RouterKnobs

    @property
    def table(self) -> RoutingTable: ...

    def pick(self, request: RouteRequest, groups: tuple[Group, ...]) -> Pick | None: ...

    def assign(self, request: RouteRequest, pick: Pick, waited: float) -> Assignment: ...

    def release(self, assignment: Assignment) -> None: ...

    def overlaps(self, request: RouteRequest) -> dict[str, int]: ...

    def unsatisfiable(self, request: RouteRequest) -> str: ...

    def busy_message(self, request: RouteRequest) -> str: ...


class Waiting:
    """The router's waiting requests; see the module docstring."""

    def __init__(
        self,
        router: Decider,
        metrics: RouterMetrics,
        depth_changed: Callable[[str, int], None],
    ) -> None:
        self._router = router
        self._metrics = metrics
        self.queue = PendingQueue(router.knobs.max_queue, depth_changed)

    @property
    def _config(self) -> RouterKnobs:
        return self._router.knobs

    async def park(self, request: RouteRequest, state: WaitState) -> Assignment:
        """Wait for a worker, first come first served, within the request's limits."""
        loop = asyncio.get_running_loop()
        waiter = Waiter(request, state, loop.time(), loop.create_future())
        deadline = waiter.deadline(self._config)
        if deadline is not None and deadline <= waiter.enqueued:
            raise self._give_up(waiter, waited=False)
        if self.queue.full:
            self._metrics.decided(request.model, "queue_full")
            raise QueueFullError(
                f"the pending queue is full ({self.queue.capacity} requests waiting); "
                f"request for model {request.model!r} not queued: {self._situation(waiter)}"
            )
        self.queue.push(waiter)
        return await self._wait(waiter)

    def recheck(self, model: str, moved: tuple[Group | None, Group | None] | None = None) -> None:
        """Offer workers to the waiters of ``model``, case by case in arrival order.

        A dispatch only adds load, so once a case found no free worker, its later waiters
        cannot find one either: one decision per case answers for all of them. When one
        worker changed (``moved``: the group it left and the one it joined, either None),
        only the cases that admit one of those groups can see a difference; the others
        keep their workers, their loads and so their situation.
        """
        cases = self.queue.cases(model)
        if not cases:
            return
        table = self._router.table
        for case, waiter in self._by_arrival(cases if moved is None else _affected(cases, moved)):
            started = time.perf_counter()
            request = waiter.request
            groups = table.eligible_groups(model, case.required, case.needs)
            pick = self._router.pick(request, groups)
            if pick is None:
                eligible = any_member(groups, case.exclude)
                self._judge(case, WaitState.BUSY if eligible else WaitState.NO_WORKER)
                continue
            self._dispatch(waiter, self._router.assign(request, pick, _waited(waiter)), started)

    def offer(self, key: str) -> None:
        """Offer one worker whose load went down to the waiting cases it suits, in order.

        By the invariant, every other eligible worker of every waiter is still busy, so
        this worker is the only possible dispatch and no full re-check is needed.
        """
        group = self._router.table.group_of(key) if self.queue else None
        if group is None or key not in group.free:
            return
        cases = self.queue.cases(group.model)
        suited = [c for c in cases if group.admits(c.required, c.needs) and key not in c.exclude]
        for _, waiter in self._by_arrival(suited):
            if key not in group.free:
                return  # busy again
            started = time.perf_counter()
            request = waiter.request
            overlap = self._router.overlaps(request).get(key, 0)
            weight = preference(group.taints, request.constraints)
            pick = Pick(group, key, overlap, weight, 0.0)
            self._dispatch(waiter, self._router.assign(request, pick, _waited(waiter)), started)

    def close(self) -> None:
        """Fail every waiting request with ``ShuttingDownError``."""
        for waiter in self.queue:
            if waiter.pending:
                self._fail(waiter, shutting_down(waiter.request), "shutdown")

    # -- one waiter

    async def _wait(self, waiter: Waiter) -> Assignment:
        """Await the waiter's future under its deadline; always leaves the queue clean."""
        future = waiter.future
        try:
            async with asyncio.timeout_at(waiter.deadline(self._config)) as waiter.timeout:
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
            self.queue.remove(waiter)

    def _abandon(self, waiter: Waiter) -> None:
        """The waiting task was cancelled: undo a dispatch it will never see."""
        future = waiter.future
        if future.cancelled():
            self._metrics.decided(waiter.model, "cancelled")
            self._metrics.wait.labels(outcome="cancelled").observe(_waited(waiter))
        elif future.exception() is None:  # also marks a failure as retrieved
            self._router.release(future.result())

    def _head(self, case: Case) -> Waiter | None:
        """The case's first waiter still waiting. A cancelled one leaves the queue here
        rather than when its task next runs, so it holds up nobody behind it."""
        while case.waiters:
            waiter = case.head()
            if waiter.pending:
                return waiter
            self.queue.remove(waiter)
        return None

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
        window = self._config.settle_window
        now = waiter.future.get_loop().time()
        waiter.settle_until = now + window if state is WaitState.NO_WORKER and window else None
        if state is WaitState.NO_WORKER and self._spent(waiter, now):
            error = NoEligibleWorkerError(self._router.unsatisfiable(waiter.request))
            self._fail(waiter, error, "no_worker")
            return
        waiter.move_deadline(self._config)

    def _dispatch(self, waiter: Waiter, assignment: Assignment, started: float) -> None:
        self.queue.remove(waiter)
        waiter.future.set_result(assignment)
        self._metrics.decided(waiter.model, "dispatched", time.perf_counter() - started)
        self._metrics.wait.labels(outcome="dispatched").observe(assignment.waited)

    def _fail(self, waiter: Waiter, error: RoutingError, outcome: str) -> None:
        self.queue.remove(waiter)
        waiter.future.set_exception(error)
        self._metrics.decided(waiter.model, outcome)
        self._metrics.wait.labels(outcome=outcome).observe(_waited(waiter))

    def _spent(self, waiter: Waiter, now: float) -> bool:
        """Whether the waiter's limit for its current state has already passed."""
        deadline = waiter.deadline(self._config)
        return deadline is not None and deadline <= now

    # -- saying why

    def _give_up(self, waiter: Waiter, *, waited: bool) -> RoutingError:
        """The error for a request whose wait is over (or was zero), with its metric."""
        request = waiter.request
        unsatisfiable = self._router.unsatisfiable
        if waited and waiter.settling(self._config):
            self._metrics.decided(request.model, "no_worker")
            self._metrics.wait.labels(outcome="no_worker").observe(_waited(waiter))
            return NoEligibleWorkerError(
                f"{unsatisfiable(request)} (waited {_waited(waiter):.3g} s: its "
                f"last eligible worker stopped qualifying, and no other did within the "
                f"{self._config.settle_window:g} s settle window)"
            )
        if not waited and waiter.state is WaitState.NO_WORKER:
            self._metrics.decided(request.model, "no_worker")
            return NoEligibleWorkerError(unsatisfiable(request))
        self._metrics.decided(request.model, "timeout")
        if waited:
            self._metrics.wait.labels(outcome="timeout").observe(_waited(waiter))
        spent = _waited(waiter) if waited else 0.0
        return QueueTimeoutError(
            f"request for model {request.model!r} waited {spent:.3g} s, its limit, "
            f"without a worker: {self._situation(waiter)}"
        )

    def _situation(self, waiter: Waiter) -> str:
        if waiter.state is WaitState.BUSY:
            return self._router.busy_message(waiter.request)
        return self._router.unsatisfiable(waiter.request)


def shutting_down(request: RouteRequest) -> ShuttingDownError:
    return ShuttingDownError(
        f"the router is shutting down; request for model {request.model!r} was not routed"
    )


def any_member(groups: Iterable[Group], exclude: Collection[str]) -> bool:
    """Whether ``groups`` hold a worker that ``exclude`` does not name. A group larger than
    the exclusions certainly does, so this looks at no more workers than are excluded."""
    return any(
        len(g.members) > len(exclude) or any(k not in exclude for k in g.members) for g in groups
    )


def _waited(waiter: Waiter) -> float:
    return waiter.future.get_loop().time() - waiter.enqueued


def _affected(cases: list[Case], moved: tuple[Group | None, Group | None]) -> list[Case]:
    """The cases that may use a worker of one of the ``moved`` groups."""
    groups = [g for g in moved if g is not None]
    return [c for c in cases if any(g.admits(c.required, c.needs) for g in groups)]
