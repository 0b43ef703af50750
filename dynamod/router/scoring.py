"""Scoring: what sending a request to a worker would cost, and how one worker is picked.

The shape follows Dynamo's default KV-router selector (approximate mode: the router knows
only what it sent, not the workers' KV events). For worker ``w`` with KV block size ``bs``
and a request of ``n`` prompt tokens, ``blocks = ceil(n / bs)``:

* ``overlap`` — leading prompt blocks this router recently sent to ``w`` (``PrefixIndex``),
  at most ``blocks``; ``credit = overlap_score_credit * overlap``;
* ``prefill_blocks = prefill tokens in flight on w / bs + blocks`` (raw, before credit);
  ``prefill_cost = prefill_load_scale * max(0, prefill_blocks - credit)``;
* ``decode_blocks = KV blocks in flight on w + (blocks - overlap)``: the blocks ``w`` would
  hold, the shared prefix counted once;
* ``active_cost = active_request_weight * (active requests on w + 1)``: the request itself
  counts, as its blocks do above, so an idle worker never costs 0 and the preference
  multiplier always has something to scale;
* ``cost = (prefill_cost + decode_blocks + active_cost) * exp(-tanh(Σ weights of the
  preferred taints w holds))`` — the multiplier lies in [1/e, e]; positive weights
  attract, negative repel, and ``+x`` / ``-x`` are reciprocal.

Selection: temperature 0 picks the minimum cost, ties broken by the injected
``random.Random``; temperature ``t > 0`` samples with probabilities ∝ ``exp(-c'/t)``, where
``c'`` are the costs normalized to [0, 1] (all equal → uniform).
"""

from __future__ import annotations

import enum
import math
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields

from dynamod.errors import ConfigError, InvalidInputError
from dynamod.model import ModelCard


@dataclass(frozen=True)
class RouterConfig:
    """Every router knob, validated on construction (``ConfigError`` names the bad one).

    ============================  =========  ==================================================
    knob                          default    meaning
    ============================  =========  ==================================================
    overlap_score_credit          1.0        blocks of prefill credit per cached prompt block,
                                             from 0 to 1; 0 turns prefix tracking off
    prefill_load_scale            1.0        weight of prefill blocks in the cost, >= 0
    active_request_weight         1.0        cost of each active request, >= 0
    temperature                   0.0        0 picks the cheapest worker; > 0 samples a
                                             softmax over normalized costs
    queue_threshold               16.0       a worker is busy when its prefill tokens in flight
                                             exceed this * ``max_num_batched_tokens`` (or its
                                             active requests reach ``max_num_seqs``); ``inf``
                                             turns the token test off
    max_queue                     1024       requests that may wait at once, >= 0
    max_queue_wait                60.0       seconds a request waits for a busy worker to
                                             free up; ``None`` waits without limit
    no_worker_wait                0.0        seconds a request waits for *any* worker to
                                             satisfy it; 0 fails at once (Dynamo's behaviour)
    prefix_ttl                    120.0      seconds a routed prompt block counts as cached
    prefix_capacity               200000     (block, worker) pairs remembered, oldest dropped
    ============================  =========  ==================================================

    A request's own ``max_wait`` replaces both waits for that request.
    """

    overlap_score_credit: float = 1.0
    prefill_load_scale: float = 1.0
    active_request_weight: float = 1.0
    temperature: float = 0.0
    queue_threshold: float = 16.0
    max_queue: int = 1024
    max_queue_wait: float | None = 60.0
    no_worker_wait: float = 0.0
    prefix_ttl: float = 120.0
    prefix_capacity: int = 200_000

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name == "max_queue_wait":
                continue
            _check(f.name, value, *_RULES[f.name])


# name → (lowest, highest, may be infinite, must be an int)
_RULES: dict[str, tuple[float, float, bool, bool]] = {
    "overlap_score_credit": (0.0, 1.0, False, False),
    "prefill_load_scale": (0.0, math.inf, False, False),
    "active_request_weight": (0.0, math.inf, False, False),
    "temperature": (0.0, math.inf, False, False),
    "queue_threshold": (0.0, math.inf, True, False),
    "max_queue": (0, math.inf, False, True),
    "max_queue_wait": (0.0, math.inf, True, False),
    "no_worker_wait": (0.0, math.inf, True, False),
    "prefix_ttl": (0.0, math.inf, True, False),
    "prefix_capacity": (0, math.inf, False, True),
}


def _check(name: str, value: object, low: float, high: float, inf: bool, integer: bool) -> None:
    kind = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind):
        what = "an integer" if integer else "a number"
        raise ConfigError(f"router setting {name} = {value!r} must be {what}")
    if math.isinf(value) and not inf:
        raise ConfigError(f"router setting {name} = {value!r} must be finite")
    if not low <= value <= high:  # NaN fails here too
        upper = "" if math.isinf(high) else f" and at most {high:g}"
        raise ConfigError(f"router setting {name} = {value!r} must be at least {low:g}{upper}")


class Busy(enum.Enum):
    """Why a worker takes no more requests for now."""

    SEQUENCES = "max_num_seqs"
    PREFILL = "prefill_tokens"


@dataclass(frozen=True)
class Load:
    """What this router has in flight on one worker. Immutable: changes make a new one."""

    active_requests: int = 0
    prefill_tokens: int = 0
    kv_blocks: int = 0

    def plus(self, prefill_tokens: int, kv_blocks: int) -> Load:
        """One more request."""
        return Load(
            self.active_requests + 1,
            self.prefill_tokens + prefill_tokens,
            self.kv_blocks + kv_blocks,
        )

    def minus(self, other: Load) -> Load:
        """This load without ``other`` (a finished request, or its finished prefill)."""
        return Load(
            self.active_requests - other.active_requests,
            self.prefill_tokens - other.prefill_tokens,
            self.kv_blocks - other.kv_blocks,
        )

    @property
    def idle(self) -> bool:
        return self == IDLE

    def busy(self, card: ModelCard, queue_threshold: float) -> Busy | None:
        """Whether the worker is over a busy threshold, and which one."""
        if self.active_requests >= card.max_num_seqs:
            return Busy.SEQUENCES
        if self.prefill_tokens > queue_threshold * card.max_num_batched_tokens:
            return Busy.PREFILL
        return None

    def describe_busy(self, card: ModelCard, queue_threshold: float) -> str:
        """``runs 1 of 1 requests`` / ``has 9000 prefill tokens in flight, over 4096``."""
        if self.busy(card, queue_threshold) is Busy.PREFILL:
            limit = queue_threshold * card.max_num_batched_tokens
            return f"has {self.prefill_tokens} prefill tokens in flight, over {limit:g}"
        return f"runs {self.active_requests} of {card.max_num_seqs} requests"


IDLE = Load()


@dataclass(frozen=True)
class CostTerms:
    """Each term of one worker's cost for one request (see the module docstring)."""

    request_blocks: int
    overlap_blocks: int
    overlap_credit: float
    prefill_blocks: float
    prefill_cost: float
    decode_blocks: float
    active_requests: int
    active_cost: float
    preference: float
    multiplier: float
    cost: float

    @property
    def load_cost(self) -> float:
        """The cost before the preferred-taint multiplier."""
        return self.prefill_cost + self.decode_blocks + self.active_cost

    @property
    def new_blocks(self) -> int:
        """KV blocks the request adds on this worker (its prefix is already there)."""
        return self.request_blocks - self.overlap_blocks


def cost_terms(
    config: RouterConfig,
    block_size: int,
    load: Load,
    *,
    prompt_tokens: int,
    overlap_blocks: int,
    preference: float,
) -> CostTerms:
    """The cost of sending a request of ``prompt_tokens`` to a worker in state ``load``.

    ``block_size`` is the worker's ``kv_block_size``: nothing else of the worker matters,
    besides its load, its prefix overlap and the preference its taints earn.
    """
    blocks = -(-prompt_tokens // block_size)
    overlap = min(overlap_blocks, blocks)
    credit = config.overlap_score_credit * overlap
    prefill_blocks = load.prefill_tokens / block_size + blocks
    prefill_cost = config.prefill_load_scale * max(0.0, prefill_blocks - credit)
    decode_blocks = float(load.kv_blocks + blocks - overlap)
    active = load.active_requests + 1
    active_cost = config.active_request_weight * active
    multiplier = math.exp(-math.tanh(preference))
    cost = (prefill_cost + decode_blocks + active_cost) * multiplier
    return CostTerms(
        blocks, overlap, credit, prefill_blocks, prefill_cost, decode_blocks,
        active, active_cost, preference, multiplier, cost,
    )  # fmt: skip


def select(costs: Sequence[float], temperature: float, rng: random.Random) -> int:
    """The index of the chosen cost: the minimum (random tie-break) or a softmax sample."""
    if temperature == 0.0:
        best = min(costs)
        ties = [i for i, c in enumerate(costs) if c == best]
        return ties[0] if len(ties) == 1 else rng.choice(ties)
    weights = probabilities(costs, temperature)
    return rng.choices(range(len(costs)), weights)[0]


def probabilities(costs: Sequence[float], temperature: float) -> list[float]:
    """How likely ``select`` is to pick each index."""
    if not costs:
        return []
    low, high = min(costs), max(costs)
    if temperature == 0.0:
        ties = sum(1 for c in costs if c == low)
        return [1.0 / ties if c == low else 0.0 for c in costs]
    if high == low:
        return [1.0 / len(costs)] * len(costs)
    # Normalized costs lie in [0, 1], so exp() cannot overflow; the cheapest has weight 1.
    weights = [math.exp(-(c - low) / (high - low) / temperature) for c in costs]
    total = sum(weights)
    return [w / total for w in weights]


class PrefixIndex:
    """Which prompt blocks this router recently sent to which worker (approximate mode).

    Block hashes are chained (``hash_blocks``): equal hashes at position ``i`` mean equal
    prompts up to block ``i``, so a worker's overlap is the number of leading blocks it
    holds. Each (block, worker) pair lives ``ttl`` seconds from its last use; beyond
    ``capacity`` pairs the least recently used go first. Removed workers are not purged:
    their pairs expire like any other, and nobody asks about them.
    """

    def __init__(
        self, ttl: float, capacity: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl = ttl
        self._capacity = capacity
        self._clock = clock
        # (block, worker) → expiry; least recently used first. The TTL is the same for
        # every pair, so this is also expiry order and trimming only looks at the front.
        self._pairs: OrderedDict[tuple[int, str], float] = OrderedDict()
        self._holders: dict[int, set[str]] = {}

    def __len__(self) -> int:
        return len(self._pairs)

    def record(self, worker: str, hashes: Iterable[int]) -> None:
        """Remember that the blocks ``hashes`` were sent to ``worker``."""
        now = self._clock()
        expiry = now + self._ttl
        for block in hashes:
            pair = (block, worker)
            self._pairs[pair] = expiry
            self._pairs.move_to_end(pair)
            self._holders.setdefault(block, set()).add(worker)
        self._trim(now)

    def overlaps(self, hashes: Sequence[int]) -> dict[str, int]:
        """Worker → number of leading blocks of ``hashes`` it holds (absent: none)."""
        self._trim(self._clock())
        found: dict[str, int] = {}
        alive: set[str] | None = None
        for depth, block in enumerate(hashes, start=1):
            holders = self._holders.get(block)
            alive = set(holders or ()) if alive is None else alive & (holders or set())
            if not alive:
                break
            found.update(dict.fromkeys(alive, depth))
        return found

    def _trim(self, now: float) -> None:
        pairs = self._pairs
        while pairs:
            pair, expiry = next(iter(pairs.items()))
            if expiry > now and len(pairs) <= self._capacity:
                return
            del pairs[pair]
            holders = self._holders[pair[0]]
            holders.discard(pair[1])
            if not holders:
                del self._holders[pair[0]]


def hash_blocks(token_ids: Sequence[int], block_size: int) -> tuple[int, ...]:
    """Chained hashes of a prompt's full blocks: hash ``i`` covers blocks ``0..i``.

    Python hashes ints and tuples of ints without per-process salt, so equal prompts give
    equal hashes in every process. The partial last block is left out: it is never cached.
    """
    if block_size < 1:
        raise InvalidInputError(f"block_size must be at least 1, got {block_size}")
    hashes = []
    parent = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, *token_ids[start : start + block_size]))
        hashes.append(parent)
    return tuple(hashes)
