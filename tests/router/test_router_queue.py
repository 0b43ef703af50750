"""The pending queue: requests wait when every eligible worker is busy, and every change of
the worker view or of the load re-checks them at once, without a timer.

Tests start a waiting request in a task and yield to the loop exactly once
(``asyncio.sleep(0)``): a new task runs its first step before the yielding task resumes
(callbacks run first in, first out), and that step reaches the wait. The router never
sleeps; nothing here waits for wall-clock time except the deadline tests, which need one.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from dynamod.discovery_events import WorkerAdded, WorkerRemoved
from dynamod.errors import (
    InvalidInputError,
    NoEligibleWorkerError,
    QueueFullError,
    QueueTimeoutError,
    RoutingError,
    ShuttingDownError,
)
from dynamod.load import IDLE
from dynamod.records import WorkerRecord
from dynamod.router import (
    Assignment,
    Router,
    RouteRequest,
    RouterKnobs,
    Verdict,
    Waiter,
    WaitState,
)
from dynamod.taints import CORDONED, RoutingConstraints
from tests.router.test_router_table import required, retaint, worker

pytestmark = pytest.mark.timeout(30)

FAST = RoutingConstraints(required_taints=frozenset({"capacity/fast"}))


def router_with(*workers: WorkerRecord, **config: float | None) -> Router:
    router = Router(RouterKnobs(**config), rng=random.Random(2))  # type: ignore[arg-type]
    for revision, record in enumerate(workers, start=1):
        router.apply(WorkerAdded(record, revision))
    return router


def sample(router: Router, name: str, **labels: str) -> float:
    value = router.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def attempt(router: Router, request: RouteRequest) -> Assignment | RoutingError:
    """``acquire``, with a routing error as the result (a task group would re-raise it)."""
    try:
        return await router.acquire(request)
    except RoutingError as exc:
        return exc


async def park(
    tg: asyncio.TaskGroup, router: Router, request: RouteRequest
) -> asyncio.Task[Assignment | RoutingError]:
    """Start ``acquire`` in a task and let it run up to its wait."""
    task = tg.create_task(attempt(router, request))
    await asyncio.sleep(0)
    assert not task.done(), "the request was expected to wait"
    assert router.depth(request.model) >= 1
    return task


def assigned(task: asyncio.Task[Assignment | RoutingError]) -> Assignment:
    result = task.result()
    assert isinstance(result, Assignment), f"expected an assignment, got {result!r}"
    return result


async def test_a_taint_update_wakes_a_request_waiting_for_a_worker_with_that_taint() -> None:
    """Dynamo's worker_taint_update_wakes_constrained_pending_request, step by step."""
    a = worker("A", "capacity/fast", max_num_seqs=1)
    b = worker("B", "capacity/slow", max_num_seqs=1)
    router = router_with(a, b)
    async with router.route(RouteRequest("m", FAST, prompt_tokens=64)) as first:
        assert first.worker == a and first.waited == 0.0
        async with asyncio.TaskGroup() as tg:
            second = await park(tg, router, RouteRequest("m", FAST, prompt_tokens=64))
            assert router.queue_depth == 1
            assert sample(router, "dynamod_router_queue_depth", model="m") == 1

            router.apply(retaint(b, "capacity/slow", "capacity/fast", revision=3))

            # Dispatched inside apply(): out of the queue, and B's load already reserved.
            assert router.queue_depth == 0
            assert router.load(b.key).active_requests == 1
        woken = assigned(second)
        assert woken.worker.instance_id == "B"
        assert woken.waited > 0.0
        router.release(woken)
    waits = "dynamod_router_queue_wait_seconds_count"
    assert sample(router, waits, outcome="dispatched") == 1
    assert sample(router, "dynamod_router_decisions_total", model="m", outcome="dispatched") == 1
    assert sample(router, "dynamod_router_decisions_total", model="m", outcome="routed") == 1
    assert router.load(a.key) == router.load(b.key) == IDLE


async def test_a_release_dispatches_the_waiters_first_come_first_served() -> None:
    router = router_with(worker("A", max_num_seqs=1))
    held = await router.acquire(RouteRequest("m"))
    async with asyncio.TaskGroup() as tg:
        early = await park(tg, router, RouteRequest("m", prompt_tokens=1))
        late = await park(tg, router, RouteRequest("m", prompt_tokens=2))
        assert router.depth("m") == 2
        router.release(held)
        assert router.depth("m") == 1  # the early one took the worker
        await asyncio.sleep(0)
        assert early.done() and not late.done()
        router.release(assigned(early))
    router.release(assigned(late))
    router.release(assigned(late))  # idempotent
    assert router.load(worker("A").key) == IDLE


async def test_a_waiter_does_not_block_requests_that_need_other_workers() -> None:
    fast = worker("A", "capacity/fast", max_num_seqs=1)
    router = router_with(fast, worker("B", "capacity/slow", max_num_seqs=1))
    held = await router.acquire(RouteRequest("m", FAST))
    async with asyncio.TaskGroup() as tg:
        waiting = await park(tg, router, RouteRequest("m", FAST))
        slow = await router.acquire(RouteRequest("m", required("capacity/slow")))
        assert slow.worker.instance_id == "B" and not waiting.done()
        router.release(held)
    assert assigned(waiting).worker == fast


async def test_one_event_wakes_as_many_waiters_as_the_new_capacity_allows_in_order() -> None:
    router = router_with(worker("A", "capacity/fast", max_num_seqs=1), worker("B", max_num_seqs=1))
    held = [await router.acquire(RouteRequest("m", FAST)), await router.acquire(RouteRequest("m"))]
    async with asyncio.TaskGroup() as tg:
        fast = [await park(tg, router, RouteRequest("m", FAST)) for _ in range(3)]
        plain = await park(tg, router, RouteRequest("m"))
        router.apply(WorkerAdded(worker("C", "capacity/fast", max_num_seqs=2), 3))
        assert router.depth("m") == 2  # fast[0] and fast[1] took C's two slots
        router.apply(WorkerAdded(worker("D", max_num_seqs=1), 4))
        assert router.depth("m") == 1  # fast[2] needs capacity/fast; plain takes D
        d = router.table.get(worker("D").key)
        assert d is not None
        router.apply(retaint(d, "capacity/fast", revision=5))
        assert router.depth("m") == 1  # D runs plain's request
        await asyncio.sleep(0)  # plain's task resumes with its assignment
        router.release(assigned(plain))
        assert router.depth("m") == 0
    assert [assigned(t).worker.instance_id for t in fast] == ["C", "C", "D"]
    assert assigned(plain).worker.instance_id == "D"
    for assignment in (*held, *(assigned(t) for t in fast)):
        router.release(assignment)


async def test_finishing_prefill_frees_a_worker_busy_on_prefill_tokens() -> None:
    a = worker("A", max_num_batched_tokens=64)
    router = router_with(a, queue_threshold=0.5)
    held = await router.acquire(RouteRequest("m", prompt_tokens=64))
    assert router.explain(RouteRequest("m")).outcome is Verdict.QUEUE
    async with asyncio.TaskGroup() as tg:
        waiting = await park(tg, router, RouteRequest("m", prompt_tokens=64))
        router.prefill_done(held)
        router.prefill_done(held)  # idempotent
    assert assigned(waiting).worker == a
    assert router.load(a.key).active_requests == 2


async def test_no_eligible_worker_fails_at_once_saying_what_exists() -> None:
    router = router_with(worker("a1b2", "capacity/slow"), worker("c3d4", "capacity/fast", CORDONED))
    with pytest.raises(NoEligibleWorkerError) as caught:
        await router.acquire(RouteRequest("m", FAST))
    assert str(caught.value) == (
        "no worker of model 'm' has capacity/fast; 2 workers: "
        "a1b2 has capacity/slow (missing capacity/fast), c3d4 is cordoned"
    )
    assert router.queue_depth == 0
    assert sample(router, "dynamod_router_decisions_total", model="m", outcome="no_worker") == 1


async def test_with_no_worker_wait_a_request_waits_for_a_worker_to_appear() -> None:
    router = router_with(no_worker_wait=30.0)
    async with asyncio.TaskGroup() as tg:
        waiting = await park(tg, router, RouteRequest("m", FAST))
        router.apply(WorkerAdded(worker("late", "capacity/slow"), 1))
        assert not waiting.done()
        router.apply(WorkerAdded(worker("fast", "capacity/fast"), 2))
    assert assigned(waiting).worker.instance_id == "fast"


async def test_a_request_max_wait_also_waits_for_a_worker_to_appear() -> None:
    router = router_with()
    async with asyncio.TaskGroup() as tg:
        waiting = await park(tg, router, RouteRequest("m", max_wait=30.0))
        router.apply(WorkerAdded(worker("new"), 1))
    assert assigned(waiting).worker.instance_id == "new"


async def test_without_a_settle_window_a_waiter_whose_last_worker_loses_the_taint_fails() -> None:
    a = worker("A", "capacity/fast", max_num_seqs=1)
    router = router_with(a, settle_window=0.0)
    held = await router.acquire(RouteRequest("m", FAST))
    async with asyncio.TaskGroup() as tg:
        waiting = await park(tg, router, RouteRequest("m", FAST))
        router.apply(retaint(a, "capacity/slow", revision=2))
        assert router.queue_depth == 0
    error = waiting.result()
    assert isinstance(error, NoEligibleWorkerError)
    assert "A has capacity/slow (missing capacity/fast)" in str(error)
    router.release(held)


async def test_a_waiter_survives_its_worker_leaving_while_its_no_worker_wait_runs() -> None:
    a = worker("A", max_num_seqs=1)
    router = router_with(a, no_worker_wait=30.0)
    held = await router.acquire(RouteRequest("m"))
    async with asyncio.TaskGroup() as tg:
        waiting = await park(tg, router, RouteRequest("m"))
        router.apply(WorkerRemoved(a, 2))
        assert router.queue_depth == 1
        router.apply(WorkerAdded(worker("B"), 3))
    assert assigned(waiting).worker.instance_id == "B"
    router.release(held)  # the load of a removed worker is simply forgotten
    assert router.load(a.key) == IDLE


async def test_losing_every_worker_moves_an_unbounded_wait_to_the_no_worker_limit() -> None:
    """Busy waits have no limit here, but once no worker is left the 50 ms one applies."""
    a = worker("A", max_num_seqs=1)
    router = router_with(a, max_queue_wait=None, no_worker_wait=0.05, settle_window=0.0)
    held = await router.acquire(RouteRequest("m"))
    async with asyncio.TaskGroup() as tg:
        waiting = await park(tg, router, RouteRequest("m"))
        router.apply(WorkerRemoved(a, 2))
    error = waiting.result()
    assert isinstance(error, QueueTimeoutError)
    assert "without a worker: no worker serves model 'm'; no workers are registered" in str(error)
    router.release(held)


async def test_the_deadline_ends_a_wait_with_queue_timeout_naming_the_busy_workers() -> None:
    router = router_with(worker("A", max_num_seqs=1))
    held = await router.acquire(RouteRequest("m"))
    with pytest.raises(
        QueueTimeoutError, match=r"all 1 worker of model 'm' are busy: A runs 1 of 1"
    ):
        await router.acquire(RouteRequest("m", max_wait=0.01))
    assert router.queue_depth == 0
    assert sample(router, "dynamod_router_queue_wait_seconds_count", outcome="timeout") == 1
    router.release(held)


async def test_a_zero_wait_fails_at_once_without_queueing() -> None:
    router = router_with(worker("A", max_num_seqs=1), max_queue_wait=0.0)
    held = await router.acquire(RouteRequest("m"))
    with pytest.raises(QueueTimeoutError, match="waited 0 s"):
        await router.acquire(RouteRequest("m"))
    assert sample(router, "dynamod_router_queue_depth", model="m") == 0
    router.release(held)


async def test_a_full_queue_refuses_the_next_request() -> None:
    router = router_with(worker("A", max_num_seqs=1), max_queue=1)
    held = await router.acquire(RouteRequest("m"))
    async with asyncio.TaskGroup() as tg:
        waiting = await park(tg, router, RouteRequest("m"))
        with pytest.raises(QueueFullError, match=r"the pending queue is full \(1 requests"):
            await router.acquire(RouteRequest("m"))
        router.release(held)
    router.release(assigned(waiting))


async def test_close_fails_the_waiters_and_refuses_new_requests() -> None:
    router = router_with(worker("A", max_num_seqs=1))
    held = await router.acquire(RouteRequest("m"))
    async with asyncio.TaskGroup() as tg:
        waiting = await park(tg, router, RouteRequest("m"))
        router.close()
    error = waiting.result()
    assert isinstance(error, ShuttingDownError)
    assert str(error) == "the router is shutting down; request for model 'm' was not routed"
    with pytest.raises(ShuttingDownError):
        await router.acquire(RouteRequest("m"))
    router.release(held)  # releasing after close is fine
    assert router.queue_depth == 0 and router.closed


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    router = router_with(worker("A", max_num_seqs=1))
    held = await router.acquire(RouteRequest("m"))
    async with asyncio.TaskGroup() as tg:
        waiting = await park(tg, router, RouteRequest("m"))
        waiting.cancel()
    assert waiting.cancelled() and router.queue_depth == 0
    assert sample(router, "dynamod_router_decisions_total", model="m", outcome="cancelled") == 1
    router.release(held)
    assert router.load(worker("A").key) == IDLE


async def test_a_waiter_cancelled_after_dispatch_gives_its_worker_back() -> None:
    router = router_with(worker("A", max_num_seqs=1))
    held = await router.acquire(RouteRequest("m"))
    async with asyncio.TaskGroup() as tg:
        waiting = await park(tg, router, RouteRequest("m"))
        router.release(held)  # dispatches the waiter: its future is resolved now...
        waiting.cancel()  # ...but its task is cancelled before it could resume
    assert waiting.cancelled()
    assert router.load(worker("A").key) == IDLE


async def test_exclude_sends_a_retry_to_another_worker() -> None:
    a, b = worker("A"), worker("B")
    router = router_with(a, b)
    first = await router.acquire(RouteRequest("m", prompt_tokens=16))
    router.release(first)
    retry = await router.acquire(RouteRequest("m", prompt_tokens=16, exclude=[first.worker.key]))
    assert retry.worker != first.worker
    router.release(retry)
    with pytest.raises(NoEligibleWorkerError, match="is excluded by the request"):
        await router.acquire(RouteRequest("m", exclude=[a.key, b.key]))


async def test_route_releases_the_worker_when_the_body_raises() -> None:
    router = router_with(worker("A"))

    async def failing_call() -> None:
        async with router.route(RouteRequest("m", prompt_tokens=10)):
            assert router.load(worker("A").key).active_requests == 1
            raise RuntimeError("worker failed")

    with pytest.raises(RuntimeError, match="worker failed"):
        await failing_call()
    assert router.load(worker("A").key) == IDLE


async def test_explain_says_why_a_request_would_wait() -> None:
    router = router_with(worker("A", "capacity/fast", max_num_seqs=1), worker("B"))
    held = await router.acquire(RouteRequest("m", FAST))
    explanation = router.explain(RouteRequest("m", FAST))
    assert explanation.outcome is Verdict.QUEUE
    assert explanation.reason == (
        "all 1 worker of model 'm' with capacity/fast are busy: A runs 1 of 1 requests"
    )
    assert [w.rank for w in explanation.workers] == [None, None]
    unsatisfiable = router.explain(RouteRequest("m", required("gpu")))
    assert unsatisfiable.outcome is Verdict.NO_WORKER
    assert unsatisfiable.reason.startswith("no worker of model 'm' has gpu; 2 workers:")
    router.release(held)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"prompt_tokens": -1}, "prompt_tokens must be at least 0, got -1"),
        ({"max_wait": -0.5}, "max_wait must be at least 0 seconds, got -0.5"),
        ({"exclude": "v1/workers/a"}, "exclude must be a collection of worker keys, not the"),
    ],
)
def test_a_malformed_request_is_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        RouteRequest("m", **fields)  # type: ignore[arg-type]


# -- the settle window: waiting through a remove-then-add move

GOLD = RoutingConstraints(required_taints=frozenset({"capacity/gold"}))


async def test_a_waiter_survives_a_move_of_its_taint_to_another_worker() -> None:
    """Issue 15.5: the only gold worker loses the taint while a request waits for it; it
    keeps waiting, and another worker gaining the taint later takes it."""
    a = worker("A", "capacity/gold", max_num_seqs=1)
    b = worker("B", "capacity/silver", max_num_seqs=1)
    router = router_with(a, b, settle_window=30.0)
    held = await router.acquire(RouteRequest("m", GOLD))
    async with asyncio.TaskGroup() as tg:
        waiting = await park(tg, router, RouteRequest("m", GOLD))
        router.apply(retaint(a, "capacity/silver", revision=3))  # removed...
        assert router.queue_depth == 1 and not waiting.done()
        router.apply(retaint(b, "capacity/gold", revision=4))  # ...then added elsewhere
        assert router.queue_depth == 0
    assert assigned(waiting).worker.instance_id == "B"
    router.release(held)
    router.release(assigned(waiting))


async def test_a_settling_waiter_whose_new_worker_is_busy_waits_for_it_as_busy() -> None:
    a = worker("A", "capacity/gold", max_num_seqs=1)
    b = worker("B", max_num_seqs=1)
    router = router_with(a, b, settle_window=30.0)
    on_a = await router.acquire(RouteRequest("m", GOLD))
    on_b = await router.acquire(RouteRequest("m"))
    async with asyncio.TaskGroup() as tg:
        waiting = await park(tg, router, RouteRequest("m", GOLD))
        router.apply(retaint(a, revision=4))
        router.apply(retaint(b, "capacity/gold", revision=5))  # gold again, but B is busy
        assert router.queue_depth == 1
        router.release(on_b)
    assert assigned(waiting).worker.instance_id == "B"
    router.release(on_a)
    router.release(assigned(waiting))


async def test_the_settle_window_ends_with_no_eligible_worker_naming_the_window() -> None:
    a = worker("A", "capacity/gold", max_num_seqs=1)
    router = router_with(a, settle_window=0.05)
    held = await router.acquire(RouteRequest("m", GOLD))
    async with asyncio.TaskGroup() as tg:
        waiting = await park(tg, router, RouteRequest("m", GOLD))
        router.apply(retaint(a, "capacity/silver", revision=2))
    error = waiting.result()
    assert isinstance(error, NoEligibleWorkerError)
    assert str(error).startswith(
        "no worker of model 'm' has capacity/gold; 1 worker: A has capacity/silver "
        "(missing capacity/gold) (waited "
    )
    assert str(error).endswith("and no other did within the 0.05 s settle window)")
    assert sample(router, "dynamod_router_queue_wait_seconds_count", outcome="no_worker") == 1
    router.release(held)


async def test_a_request_unsatisfiable_on_arrival_fails_at_once_despite_the_window() -> None:
    router = router_with(worker("A", "capacity/silver"), settle_window=30.0)
    with pytest.raises(NoEligibleWorkerError, match="no worker of model 'm' has capacity/gold"):
        await router.acquire(RouteRequest("m", GOLD))
    assert router.queue_depth == 0


def test_the_settle_window_sets_the_deadline_only_when_later_and_within_the_busy_limit() -> None:
    loop = asyncio.new_event_loop()
    try:

        def deadline(
            settle_until: float | None, max_wait: float | None = None, **knobs: float | None
        ) -> float | None:
            config = RouterKnobs(**knobs)  # type: ignore[arg-type]
            request = RouteRequest("m", GOLD, max_wait=max_wait)
            waiter = Waiter(request, WaitState.NO_WORKER, 100.0, loop.create_future())
            waiter.settle_until = settle_until
            return waiter.deadline(config)

        assert deadline(None) == 100.0  # unsatisfiable on arrival: fail at once
        assert deadline(103.0) == 103.0
        assert deadline(103.0, no_worker_wait=10.0) == 110.0  # the longer limit wins
        assert deadline(103.0, max_queue_wait=2.0) == 102.0  # never past the busy limit
        assert deadline(103.0, max_queue_wait=None) == 103.0
        assert deadline(103.0, max_wait=1.0) == 101.0  # the request's own limit rules
    finally:
        loop.close()


async def test_the_queue_signal_tells_each_join_and_leave_of_a_model() -> None:
    """``watch_queue``: what a test (or anything) waits on instead of sampling the depth."""
    a = worker("A", "capacity/fast", max_num_seqs=1)
    router = router_with(a)
    seen: list[tuple[str, int]] = []
    stop = router.watch_queue(lambda model, depth: seen.append((model, depth)))
    async with router.route(RouteRequest("m", FAST)), asyncio.TaskGroup() as tg:
        await park(tg, router, RouteRequest("m", FAST))
        await park(tg, router, RouteRequest("m", FAST))
        assert seen == [("m", 1), ("m", 2)]
        router.close()
    assert seen[-1] == ("m", 0)
    stop()
    assert router.queue_depth == 0
