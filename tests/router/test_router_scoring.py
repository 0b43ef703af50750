"""Scoring: the cost formula, selection, the prefix index, and how the router uses them
(prefix reuse, load spreading, preferred taints attracting and repelling)."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from dynamod.discovery_events import WorkerAdded
from dynamod.errors import ConfigError, InvalidInputError
from dynamod.load import IDLE, Busy, Load
from dynamod.records import ModelCard, WorkerRecord
from dynamod.router import (
    Assignment,
    PrefixIndex,
    Router,
    RouteRequest,
    RouterKnobs,
    Verdict,
    cost_terms,
    prefix_hashes,
    probabilities,
    select,
)
from dynamod.taints import RoutingConstraints
from tests.router.test_router_table import worker


def router_with(*workers: WorkerRecord, seed: int = 1, **config: float) -> Router:
    router = Router(RouterKnobs(**config), rng=random.Random(seed))  # type: ignore[arg-type]
    for revision, record in enumerate(workers, start=1):
        router.apply(WorkerAdded(record, revision))
    return router


def prefer(**weights: float) -> RoutingConstraints:
    return RoutingConstraints(preferred_taints={k.replace("_", "/"): w for k, w in weights.items()})


# -- configuration


def test_the_default_config_is_valid_and_matches_the_documented_defaults() -> None:
    config = RouterKnobs()
    assert (config.overlap_score_credit, config.prefill_load_scale) == (1.0, 1.0)
    assert (config.temperature, config.queue_threshold) == (0.0, 16.0)
    assert (config.max_queue, config.max_queue_wait, config.no_worker_wait) == (1024, 60.0, 0.0)


@pytest.mark.parametrize(
    ("knob", "value", "words"),
    [
        ("overlap_score_credit", 1.5, "at most 1"),
        ("prefill_load_scale", -1.0, "at least 0"),
        ("temperature", math.nan, "at least 0"),
        ("active_request_weight", math.inf, "must be finite"),
        ("max_queue", 2.5, "an integer"),
        ("prefix_capacity", True, "an integer"),
        ("no_worker_wait", "5", "a number"),
    ],
)
def test_a_bad_knob_is_refused_with_its_name_and_rule(knob: str, value: object, words: str) -> None:
    with pytest.raises(ConfigError, match=rf"router setting {knob} = .* {words}"):
        RouterKnobs(**{knob: value})  # type: ignore[arg-type]


def test_waits_may_be_unbounded() -> None:
    assert RouterKnobs(max_queue_wait=None, queue_threshold=math.inf).max_queue_wait is None


# -- the cost formula


def test_cost_terms_follow_the_documented_formula() -> None:
    load = Load(active_requests=2, prefill_tokens=32, kv_blocks=10)
    terms = cost_terms(
        RouterKnobs(overlap_score_credit=0.5, prefill_load_scale=2.0),
        16,
        load,
        prompt_tokens=70,  # 5 blocks, the last one partial
        overlap_blocks=3,
        preference=0.0,
    )
    assert terms.request_blocks == 5
    assert terms.overlap_credit == 1.5
    assert terms.prefill_blocks == 2 + 5
    assert terms.prefill_cost == 2.0 * (7 - 1.5)
    assert terms.decode_blocks == 10 + 5 - 3
    assert terms.active_cost == 3  # the request itself counts
    assert terms.multiplier == 1.0
    assert terms.cost == terms.load_cost == 11 + 12 + 3


def test_preferred_weights_scale_the_cost_reciprocally_within_e() -> None:
    def cost(weight: float) -> float:
        return cost_terms(
            RouterKnobs(), 16, IDLE, prompt_tokens=64, overlap_blocks=0, preference=weight
        ).cost

    plain = cost(0.0)
    assert cost(0.5) < plain < cost(-0.5)
    assert cost(0.5) * cost(-0.5) == pytest.approx(plain * plain)
    assert plain / math.e < cost(3.0) < plain < cost(-3.0) < plain * math.e


def test_busy_thresholds_are_max_num_seqs_and_prefill_tokens_over_the_fraction() -> None:
    card = ModelCard(name="m", max_num_seqs=2, max_num_batched_tokens=100)
    assert Load(1, 50, 0).busy(card, 0.5) is None
    assert Load(1, 51, 0).busy(card, 0.5) is Busy.PREFILL
    assert Load(2, 0, 0).busy(card, 0.5) is Busy.SEQUENCES
    assert Load(2, 0, 0).describe_busy(card, 0.5) == "runs 2 of 2 requests"
    assert Load(1, 51, 0).describe_busy(card, 0.5) == ("has 51 prefill tokens in flight, over 50")


# -- selection


def test_temperature_zero_picks_the_minimum_and_breaks_ties_with_the_rng() -> None:
    rng = random.Random(3)
    assert select([3.0, 1.0, 2.0], 0.0, rng) == 1
    picks = Counter(select([1.0, 5.0, 1.0], 0.0, rng) for _ in range(200))
    assert set(picks) == {0, 2}
    assert probabilities([1.0, 5.0, 1.0], 0.0) == [0.5, 0.0, 0.5]


def test_softmax_probabilities_favour_cheaper_workers_and_are_uniform_on_ties() -> None:
    chances = probabilities([1.0, 2.0, 3.0], 0.5)
    assert sum(chances) == pytest.approx(1.0)
    assert chances[0] > chances[1] > chances[2] > 0
    assert probabilities([4.0, 4.0], 1.0) == [0.5, 0.5]
    rng = random.Random(5)
    picks = Counter(select([1.0, 2.0, 3.0], 0.5, rng) for _ in range(3000))
    assert picks[0] / 3000 == pytest.approx(chances[0], abs=0.04)


# -- the prefix index


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_overlap_counts_leading_blocks_per_worker() -> None:
    index = PrefixIndex(ttl=10, capacity=100, clock=FakeClock())
    index.record("a", [1, 2, 3])
    index.record("b", [1, 2, 9])
    assert index.overlaps([1, 2, 3, 4]) == {"a": 3, "b": 2}
    assert index.overlaps([5, 1, 2]) == {}  # overlap is a prefix: the first block must match
    assert index.overlaps([]) == {}


def test_prefix_entries_expire_after_the_ttl_since_their_last_use() -> None:
    clock = FakeClock()
    index = PrefixIndex(ttl=10, capacity=100, clock=clock)
    index.record("a", [1, 2])
    clock.now = 6
    index.record("a", [1])  # refreshes block 1 only
    clock.now = 12
    assert index.overlaps([1, 2]) == {"a": 1}
    clock.now = 16
    assert index.overlaps([1, 2]) == {}
    assert len(index) == 0


def test_the_prefix_index_keeps_at_most_capacity_pairs_dropping_the_oldest() -> None:
    index = PrefixIndex(ttl=100, capacity=3, clock=FakeClock())
    index.record("a", [1, 2])
    index.record("b", [1, 2])
    assert len(index) == 3
    # a's first block, the oldest pair, went: a no longer holds the prefix at all.
    assert index.overlaps([1, 2]) == {"b": 2}


def test_block_hashes_are_chained_over_full_blocks() -> None:
    one = prefix_hashes([1, 2, 3, 4, 5, 6, 7], 2)
    two = prefix_hashes([1, 2, 3, 9, 5, 6], 2)
    assert len(one) == 3  # token 7 is a partial block
    assert one[0] == two[0]
    assert one[1] != two[1] and one[2] != two[2]  # divergence spreads to every later block
    with pytest.raises(InvalidInputError, match="block_size must be at least 1, got 0"):
        prefix_hashes([1], 0)


# -- the router's choices


async def decide(router: Router, request: RouteRequest) -> Assignment:
    """Route one request and give the worker straight back."""
    async with router.route(request) as assignment:
        return assignment


async def test_a_repeated_prompt_goes_back_to_the_worker_that_has_its_prefix() -> None:
    router = router_with(worker("a"), worker("b"), worker("c"))
    for prompt in range(20):
        tokens = [prompt] * 128
        request = RouteRequest("m", prompt_tokens=128, block_hashes=prefix_hashes(tokens, 16))
        first = await decide(router, request)
        again = await decide(router, request)
        assert first.terms.overlap_blocks == 0
        assert again.worker == first.worker
        assert again.terms.overlap_blocks == 8
        assert again.terms.cost < first.terms.cost


async def test_load_spreads_requests_evenly_over_equal_workers() -> None:
    router = router_with(*(worker(f"w{i}") for i in range(4)))
    held = [await router.acquire(RouteRequest("m", prompt_tokens=100)) for _ in range(12)]
    assert Counter(a.worker.instance_id for a in held) == {f"w{i}": 3 for i in range(4)}
    for assignment in held:
        router.release(assignment)
    assert all(router.load(f"w{i}") == IDLE for i in range(4))


async def test_load_outweighs_a_cached_prefix_once_a_worker_is_busy_enough() -> None:
    router = router_with(worker("a"), worker("b"))
    request = RouteRequest("m", prompt_tokens=64, block_hashes=prefix_hashes(list(range(64)), 16))
    first = await decide(router, request)
    held = [await router.acquire(RouteRequest("m", prompt_tokens=640)) for _ in range(2)]
    assert {a.worker.instance_id for a in held} == {"a", "b"}
    busy_one = next(a for a in held if a.worker == first.worker)
    router.release(next(a for a in held if a is not busy_one))
    assert (await decide(router, request)).worker != first.worker


async def preferred_share(weight: float, decisions: int = 2000) -> float:
    """How often an idle worker with ``gpu=h100`` wins against an idle one without."""
    router = router_with(worker("a", "gpu=h100"), worker("b"), seed=11, temperature=1.0)
    request = RouteRequest("m", prefer(**{"gpu=h100": weight}), prompt_tokens=64)
    wins = 0
    for _ in range(decisions):
        wins += (await decide(router, request)).worker.instance_id == "a"
    return wins / decisions


async def test_preferred_taints_attract_and_negative_weights_repel() -> None:
    # Normalized costs are 0 (cheaper) and 1, so at temperature 1 the cheaper worker
    # wins with probability 1 / (1 + e^-1) ~ 0.73, whatever the weight's size.
    attract, neutral, repel = [await preferred_share(w) for w in (0.5, 0.0, -0.5)]
    assert attract == pytest.approx(0.731, abs=0.04)
    assert neutral == pytest.approx(0.5, abs=0.04)
    assert repel == pytest.approx(0.269, abs=0.04)


async def test_at_temperature_zero_a_preferred_worker_takes_more_of_the_load() -> None:
    router = router_with(worker("a", "pool=fast"), worker("b"), worker("c"))
    request = RouteRequest("m", prefer(**{"pool=fast": 1.0}), prompt_tokens=160)
    held = [await router.acquire(request) for _ in range(12)]
    share = Counter(a.worker.instance_id for a in held)
    assert share["a"] > share["b"] and share["a"] > share["c"]


async def test_explain_ranks_candidates_with_their_terms_and_says_why_others_are_out() -> None:
    from dynamod.taints import CORDONED

    router = router_with(
        worker("fast1", "capacity/fast"),
        worker("fast2", "capacity/fast"),
        worker("slow", "capacity/slow"),
        worker("off", "capacity/fast", CORDONED),
    )
    held = await router.acquire(RouteRequest("m", prompt_tokens=64, exclude=[worker("fast1").key]))
    request = RouteRequest(
        "m",
        RoutingConstraints(frozenset({"capacity/fast"})),
        prompt_tokens=32,
    )
    explanation = router.explain(request)
    assert explanation.outcome is Verdict.ROUTE and explanation.reason == ""
    ranked = [(w.worker.instance_id, w.rank, w.probability) for w in explanation.workers]
    assert ranked == [("fast1", 1, 1.0), ("fast2", 2, 0.0), ("off", None, 0.0), ("slow", None, 0.0)]
    loaded = explanation.workers[1]
    assert loaded.load == router.load(held.worker.key) and loaded.terms.active_requests == 2
    off, slow = explanation.workers[2:]
    assert off.ineligible is not None and off.ineligible.cordoned
    assert slow.ineligible is not None and slow.ineligible.missing == ("capacity/fast",)
    assert router.queue_depth == 0  # explaining routes nothing
    assert router.load(worker("fast1").key) == IDLE
