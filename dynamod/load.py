"""The load one router holds on one worker: requests, prefill tokens and KV blocks in flight.

The router reserves load when it chooses a worker and gives it back when the request ends;
operators see it in ``dynamoctl workers ls`` (LOAD) and the gRPC ``Worker.load``. A worker
is *busy* when its load reaches its model card's limits.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from dynamod.records import ModelCard


class Busy(enum.Enum):
    """Why a worker takes no more requests for now."""

    SEQUENCES = "max_num_seqs"
    PREFILL = "prefill_tokens"
    ENGINE_QUEUE = "engine_waiting"
    """The worker's engine reports requests waiting in its own queue."""
    UNHEALTHY = "unhealthy"
    """The worker reports that its engine cannot serve (``router/saturation.py``)."""


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
