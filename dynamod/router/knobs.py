"""The router's settings: every knob, its default and its range, checked on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from dynamod.errors import ConfigError


@dataclass(frozen=True)
class RouterKnobs:
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
    sample_candidates             16         at temperature > 0, the softmax runs over this
                                             many of the cheapest free eligible workers,
                                             >= 1
    queue_threshold               16.0       a worker is busy when its prefill tokens in flight
                                             exceed this * ``max_num_batched_tokens`` (or its
                                             active requests reach ``max_num_seqs``); ``inf``
                                             turns the token test off
    max_queue                     1024       requests that may wait at once, >= 0
    max_queue_wait                60.0       seconds a request waits for a busy worker to
                                             free up; ``None`` waits without limit
    no_worker_wait                0.0        seconds a request waits for *any* worker to
                                             satisfy it; 0 fails at once (Dynamo's behaviour)
    settle_window                 1.0        seconds a *waiting* request whose last eligible
                                             worker stopped qualifying (a taint moved away,
                                             a cordon, a removal) keeps waiting for another
                                             to qualify; 0 fails it at once
    prefix_ttl                    120.0      seconds a routed prompt block counts as cached
    prefix_capacity               200000     (block, worker) pairs remembered, oldest dropped
    kv_blocks_per_worker          1048576    KV-aware mode: blocks indexed per worker from
                                             its engine's KV events (fewer when its engine
                                             holds fewer), oldest dropped; 0 ignores KV
                                             events (approximate mode for every worker);
                                             read at start only
    ============================  =========  ==================================================

    A request's own ``max_wait`` replaces every wait for that request. The settle window
    never makes a request wait longer than ``max_queue_wait`` would have.
    """

    overlap_score_credit: float = 1.0
    prefill_load_scale: float = 1.0
    active_request_weight: float = 1.0
    temperature: float = 0.0
    sample_candidates: int = 16
    queue_threshold: float = 16.0
    max_queue: int = 1024
    max_queue_wait: float | None = 60.0
    no_worker_wait: float = 0.0
    settle_window: float = 1.0
    prefix_ttl: float = 120.0
    prefix_capacity: int = 200_000
    kv_blocks_per_worker: int = 1 << 20

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
    "sample_candidates": (1, math.inf, False, True),
    "queue_threshold": (0.0, math.inf, True, False),
    "max_queue": (0, math.inf, False, True),
    "max_queue_wait": (0.0, math.inf, True, False),
    "no_worker_wait": (0.0, math.inf, True, False),
    "settle_window": (0.0, math.inf, False, False),
    "prefix_ttl": (0.0, math.inf, True, False),
    "prefix_capacity": (0, math.inf, False, True),
    "kv_blocks_per_worker": (0, math.inf, False, True),
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
