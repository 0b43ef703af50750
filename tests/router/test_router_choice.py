"""The fast decision against brute force: on random fleets, loads, prefix overlaps and
constraints, the router picks a worker whose cost is the minimum over every free eligible
worker; and the queue, kept in cases, still serves waiters first come first served and
leaves none beside a free worker it could use.

The oracle is the obvious rule, written here again: every worker of the model, the
eligibility rule (``why_not``), the busy rule, the cost formula (``cost_terms``).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from dynamod.discovery_events import ViewResync
from dynamod.errors import NoEligibleWorkerError, QueueTimeoutError, RoutingError
from dynamod.records import WorkerRecord
from dynamod.router import (
    Assignment,
    LoadOrder,
    Router,
    RouteRequest,
    RouterKnobs,
    cost_terms,
    why_not,
)
from dynamod.taints import CORDONED, RoutingConstraints, preference
from tests.router.test_router_table import retaint, worker

TAINTS = ["pool=a", "pool=b", "gpu", "zone=z1", CORDONED]


class Overlaps:
    """An in-memory overlap source: what a KV-event-fed index would report, fixed."""

    def __init__(self, found: Mapping[str, int]) -> None:
        self.found = dict(found)

    def overlaps(self, hashes: Sequence[int]) -> Mapping[str, int]:
        return self.found if hashes else {}

    def record(self, worker: str, hashes: object) -> None:
        """A source fed by the workers' own events learns nothing from the router."""

    def source(self, worker: str) -> str:
        return "kv"


@dataclass(frozen=True)
class Fleet:
    workers: list[WorkerRecord]
    held: list[tuple[int, int, frozenset[str]]]  # (worker index, prompt tokens, required)
    overlaps: dict[int, int]  # worker index -> leading blocks held


fleets = st.builds(
    Fleet,
    workers=st.lists(
        st.builds(
            lambda taints, seqs, size, batched: (taints, seqs, size, batched),
            st.frozensets(st.sampled_from(TAINTS), max_size=3),
            st.integers(1, 3),
            st.sampled_from([8, 16]),
            st.sampled_from([64, 8192]),
        ),
        min_size=1,
        max_size=24,
    ).map(
        lambda specs: [
            worker(
                f"w{i}",
                *taints,
                model="m" if i % 5 else "n",
                max_num_seqs=seqs,
                kv_block_size=size,
                max_num_batched_tokens=batched,
            )
            for i, (taints, seqs, size, batched) in enumerate(specs)
        ]
    ),
    held=st.lists(
        st.tuples(st.integers(0, 23), st.integers(0, 900), st.frozensets(st.sampled_from(TAINTS))),
        max_size=30,
    ),
    overlaps=st.dictionaries(st.integers(0, 30), st.integers(0, 40), max_size=8),
)
requests = st.builds(
    lambda need, prefer, tokens, exclude: (need, prefer, tokens, exclude),
    st.frozensets(st.sampled_from(TAINTS), max_size=2),
    st.dictionaries(st.sampled_from(TAINTS), st.sampled_from([-1.0, -0.3, 0.5, 1.0]), max_size=2),
    st.integers(0, 700),
    st.frozensets(st.integers(0, 23), max_size=3),
)
configs = st.builds(
    RouterKnobs,
    overlap_score_credit=st.sampled_from([0.0, 0.5, 1.0]),
    prefill_load_scale=st.sampled_from([0.0, 1.0, 2.5]),
    active_request_weight=st.sampled_from([0.0, 1.0, 3.0]),
    queue_threshold=st.sampled_from([0.5, 16.0, math.inf]),
)


def brute_force(router: Router, request: RouteRequest, overlaps: Mapping[str, int]) -> list[float]:
    """The cost of every free eligible worker, the obvious way."""
    costs = []
    for record in router.table.workers(request.model):
        load = router.load(record.key)
        if why_not(record, request.constraints, request.exclude) is not None:
            continue
        if load.busy(record.model_card, router.knobs.queue_threshold) is not None:
            continue
        terms = cost_terms(
            router.knobs,
            record.model_card.kv_block_size,
            load,
            prompt_tokens=request.prompt_tokens,
            overlap_blocks=overlaps.get(record.key, 0),
            preference=preference(record.taints, request.constraints),
        )
        costs.append(terms.cost)
    return costs


async def load_up(router: Router, fleet: Fleet) -> list[Assignment]:
    """Hold requests on the fleet so that the loads are anything but uniform."""
    held = []
    for index, tokens, need in fleet.held:
        if index >= len(fleet.workers):
            continue
        target = fleet.workers[index]
        others = [w.key for w in fleet.workers if w.key != target.key]
        request = RouteRequest(
            target.model,
            RoutingConstraints(need & set(target.taints)),
            prompt_tokens=tokens,
            exclude=others,
            max_wait=0,
        )
        try:
            held.append(await router.acquire(request))
        except RoutingError:
            continue  # busy: the load stays as it is
    for assignment in held[::3]:
        router.prefill_done(assignment)
    return held


@settings(max_examples=400, deadline=None)
@given(fleet=fleets, config=configs, shape=requests, seed=st.integers(0, 3))
def test_the_chosen_cost_is_the_brute_force_minimum_at_temperature_zero(
    fleet: Fleet,
    config: RouterKnobs,
    shape: tuple[frozenset[str], dict[str, float], int, frozenset[int]],
    seed: int,
) -> None:
    need, prefer, tokens, excluded = shape
    keys = [w.key for w in fleet.workers]
    overlaps = {keys[i]: d for i, d in fleet.overlaps.items() if i < len(keys)}
    overlaps["v1/workers/gone/worker/x/0"] = 3  # a worker the router no longer knows
    router = Router(config, rng=random.Random(seed), overlaps=Overlaps(overlaps))
    router.apply(ViewResync(tuple(fleet.workers), 1))
    request = RouteRequest(
        "m",
        RoutingConstraints(need, prefer),
        prompt_tokens=tokens,
        block_hashes=(1, 2, 3),
        exclude={keys[i] for i in excluded if i < len(keys)},
        max_wait=0,
    )
    # With no credit for it, the router does not track prefixes at all.
    credited = overlaps if config.overlap_score_credit > 0 else {}

    async def scenario() -> tuple[Assignment | RoutingError, list[float]]:
        await load_up(router, fleet)
        costs = brute_force(router, request, credited)
        explained = router.explain(request)
        assert sorted(w.terms.cost for w in explained.workers if w.rank) == sorted(costs)
        try:
            return await router.acquire(request), costs
        except RoutingError as exc:
            return exc, costs

    outcome, costs = asyncio.run(scenario())
    if costs:
        assert isinstance(outcome, Assignment), outcome
        # The fast path adds the cost's terms in another order: equal up to rounding.
        assert math.isclose(outcome.terms.cost, min(costs), rel_tol=1e-9, abs_tol=1e-12)
        assert why_not(outcome.worker, request.constraints, request.exclude) is None
    elif any(
        why_not(w, request.constraints, request.exclude) is None for w in router.table.workers("m")
    ):
        assert isinstance(outcome, QueueTimeoutError), outcome  # eligible, all busy
    else:
        assert isinstance(outcome, NoEligibleWorkerError), outcome


def test_a_load_order_yields_by_rank_then_by_time_at_that_rank_and_restores_itself() -> None:
    order = LoadOrder()
    for key, rank in [("a", 2.0), ("b", 0.0), ("c", 1.0), ("d", 0.0)]:
        order.put(key, rank)
    order.put("b", 0.0)  # moved: now behind d at the same rank
    assert order.first() == (0.0, 3, "d")
    assert order.first(skip={"d"})[2] == "b"  # type: ignore[index]
    iterator = order.ascending(skip={"c"})
    assert [next(iterator)[2], next(iterator)[2]] == ["d", "b"]
    iterator.close()  # what it took is back
    assert [e[2] for e in order.ascending()] == ["d", "b", "c", "a"]
    order.discard("d")
    assert order.rank("d") is None and "d" not in order and len(order) == 3
    assert order.first() == (0.0, 4, "b")


def test_a_load_order_stays_small_however_often_its_keys_move() -> None:
    order = LoadOrder()
    for step in range(10_000):
        order.put(f"k{step % 10}", float(step % 7))
    assert len(order) == 10
    assert len(order._heap) <= 2 * 10 + 64  # the memory bound itself


# -- the queue, kept in cases


@dataclass(frozen=True)
class Step:
    kind: str  # "wait", "release", "move"
    index: int
    taints: frozenset[str]


steps = st.lists(
    st.builds(
        Step,
        st.sampled_from(["wait", "wait", "release", "move"]),
        st.integers(0, 5),
        st.frozensets(st.sampled_from(TAINTS[:4]), max_size=2),
    ),
    max_size=40,
)


Arrival = tuple[RouteRequest, "asyncio.Task[Assignment | RoutingError]"]


async def _attempt(router: Router, request: RouteRequest) -> Assignment | RoutingError:
    """``acquire``, with a routing error as the result (a task group would re-raise it)."""
    try:
        return await router.acquire(request)
    except RoutingError as exc:
        return exc


@settings(max_examples=300, deadline=None)
@given(plan=steps, seed=st.integers(0, 3))
def test_waiters_are_served_in_arrival_order_and_none_waits_beside_a_free_worker(
    plan: list[Step], seed: int
) -> None:
    asyncio.run(_queue_scenario(plan, seed))


async def _queue_scenario(plan: list[Step], seed: int) -> None:
    fleet = {f"w{i}": worker(f"w{i}", TAINTS[i % 4], max_num_seqs=1) for i in range(4)}
    router = Router(RouterKnobs(max_queue_wait=None), rng=random.Random(seed))
    router.apply(ViewResync(tuple(fleet.values()), 1))
    arrivals: list[Arrival] = []
    held: list[Assignment] = []
    revision = 1
    async with asyncio.TaskGroup() as tg:
        for step in plan:
            before = {id(t): t.done() for _, t in arrivals}
            if step.kind == "wait":
                need = frozenset(sorted(step.taints)[:1])
                request = RouteRequest("m", RoutingConstraints(need), prompt_tokens=step.index)
                arrivals.append((request, tg.create_task(_attempt(router, request))))
            elif step.kind == "release" and held:
                router.release(held.pop(step.index % len(held)))
            elif step.kind == "move":
                revision += 1
                name = f"w{step.index % 4}"
                router.apply(retaint(fleet[name], *step.taints, revision=revision))
                fleet[name] = router.table.get(fleet[name].key) or fleet[name]
            await asyncio.sleep(0)  # a new waiter runs up to its wait
            newly = [(r, t) for r, t in arrivals if t.done() and not before.get(id(t), False)]
            _check_arrival_order(arrivals, newly)
            held.extend(a for _, t in newly if isinstance(a := t.result(), Assignment))
            _check_no_waiter_beside_a_free_worker(router, arrivals)
        router.close()
    for assignment in held:
        router.release(assignment)


def _check_arrival_order(arrivals: list[Arrival], newly: list[Arrival]) -> None:
    """No waiter still waiting could use a worker just given to a later arrival."""
    position = {id(t): n for n, (_, t) in enumerate(arrivals)}
    for _, task in newly:
        result = task.result()
        if not isinstance(result, Assignment):
            continue
        given_to = result.worker
        for request, other in arrivals[: position[id(task)]]:
            if not other.done():
                assert why_not(given_to, request.constraints) is not None, (
                    "an earlier waiter could have used the worker a later one got"
                )


def _check_no_waiter_beside_a_free_worker(router: Router, arrivals: list[Arrival]) -> None:
    for request, task in arrivals:
        if task.done():
            continue
        for record in router.table.workers("m"):
            free = router.load(record.key).busy(record.model_card, 16.0) is None
            eligible = why_not(record, request.constraints) is None
            assert not (free and eligible), f"a waiter sits beside free worker {record.key}"
