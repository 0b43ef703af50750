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

The same cost, taken apart (what lets a decision skip most workers, ``choice.py``). The
credit never exceeds the blocks (``overlap_score_credit`` ≤ 1 and ``overlap`` ≤
``blocks``), so the ``max(0, .)`` never binds and, with ``s = prefill_load_scale``,
``c = overlap_score_credit``, ``w = active_request_weight``::

    cost = multiplier * (rank + constant - overlap * per_block)
    rank      = s * prefill tokens in flight / bs + KV blocks in flight + w * active requests
    constant  = s * blocks + blocks + w
    per_block = s * c + 1

``rank`` depends only on the worker's load (``load_rank``), ``constant`` and ``per_block``
only on the request and ``bs`` (``RequestShape``), the multiplier only on the worker's
taints and the request's preferred taints.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from dynamod.load import Load
from dynamod.router.knobs import RouterKnobs


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
    knobs: RouterKnobs,
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
    credit = knobs.overlap_score_credit * overlap
    prefill_blocks = load.prefill_tokens / block_size + blocks
    prefill_cost = knobs.prefill_load_scale * max(0.0, prefill_blocks - credit)
    decode_blocks = float(load.kv_blocks + blocks - overlap)
    active = load.active_requests + 1
    active_cost = knobs.active_request_weight * active
    factor = multiplier(preference)
    cost = (prefill_cost + decode_blocks + active_cost) * factor
    return CostTerms(
        blocks, overlap, credit, prefill_blocks, prefill_cost, decode_blocks,
        active, active_cost, preference, factor, cost,
    )  # fmt: skip


def load_rank(knobs: RouterKnobs, block_size: int, load: Load) -> float:
    """The part of a worker's cost that depends on its load (module docstring): among
    workers of one group without prefix overlap, the lower rank is the cheaper."""
    return (
        knobs.prefill_load_scale * load.prefill_tokens / block_size
        + load.kv_blocks
        + knobs.active_request_weight * load.active_requests
    )


@dataclass(frozen=True, slots=True)
class RequestShape:
    """What one request's cost adds for workers of one block size (module docstring)."""

    blocks: int
    constant: float
    per_block: float

    @classmethod
    def of(cls, knobs: RouterKnobs, block_size: int, prompt_tokens: int) -> RequestShape:
        blocks = -(-prompt_tokens // block_size)
        scale = knobs.prefill_load_scale
        constant = scale * blocks + blocks + knobs.active_request_weight
        return cls(blocks, constant, scale * knobs.overlap_score_credit + 1.0)

    def estimate(self, factor: float, rank: float, overlap: int = 0) -> float:
        """The cost of a worker at ``rank`` with ``overlap`` leading blocks cached and the
        preferred-taint multiplier ``factor``. Equal to
        ``cost_terms(...).cost`` but for rounding in the last bits (the sum is associated
        differently)."""
        return factor * (rank + self.constant - min(overlap, self.blocks) * self.per_block)


def multiplier(preference: float) -> float:
    """The preferred-taint multiplier for a sum of matched weights: ``exp(-tanh(sum))``."""
    return math.exp(-math.tanh(preference))


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
