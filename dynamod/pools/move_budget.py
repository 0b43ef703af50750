"""A policy's move budget: at most ``max_moves`` moves in any ``interval`` seconds.

Like a rollout's max-unavailable, but over time: a sliding window over the moments moves
were made. Pure: the caller passes its clock's reading (``loop.time()``), so tests need no
sleeping. The budget lives in the leader's memory, so a new leader starts with a full one
(at most one extra window's worth of moves across a failover).
"""

from __future__ import annotations

from collections import deque

from dynamod.pools.policy import PoolPolicy


class MoveBudget:
    """How many moves a policy may still make now. Without ``max_moves``: unlimited."""

    def __init__(self, max_moves: int | None, interval: float | None) -> None:
        if max_moves is not None and (interval is None or interval <= 0 or max_moves < 1):
            raise ValueError(f"a move budget needs max_moves >= 1 and an interval > 0: {interval}")
        self.max_moves = max_moves
        self.interval = interval or 0.0
        self._made: deque[float] = deque()

    @classmethod
    def of(cls, policy: PoolPolicy) -> MoveBudget:
        return cls(policy.max_moves, policy.interval)

    def allowed(self, now: float) -> int | None:
        """Moves that may start at ``now``; None when the policy has no budget."""
        if self.max_moves is None:
            return None
        self._forget(now)
        return max(0, self.max_moves - len(self._made))

    def spend(self, now: float, count: int = 1) -> None:
        """Record ``count`` moves made at ``now``."""
        if self.max_moves is not None:
            self._made.extend([now] * count)

    def refills_at(self, now: float) -> float | None:
        """When the next move becomes allowed, if none is now: the moment the oldest move
        in the window leaves it. None when one is allowed now or there is no budget."""
        if self.allowed(now) != 0:
            return None
        return self._made[0] + self.interval

    def _forget(self, now: float) -> None:
        while self._made and self._made[0] + self.interval <= now:
            self._made.popleft()
