"""The one back-off: the delays between attempts of every retry and reconnect loop.

The n-th delay after a reset is drawn uniformly from ``[0, min(cap, first * 2**(n-1))]``:
exponential growth, capped, with *full jitter* (the delay itself is random, not a random
slice added to a fixed one). A fleet that lost its store at one instant therefore comes
back spread over the whole window instead of in lockstep: 50 workers re-registering after
an etcd restart hit it at 50 different moments, and a compare-and-swap that collided does
not collide again at the same offset.

``reset()`` is for *real progress* only, and each loop says what that is: a watch stream
that delivered an event, a write that committed, an events stream that stayed up past its
snapshot. Resetting on a mere connect would let a peer that accepts and then breaks every
connection drive the loop at full speed forever.

Every loop in the project uses this class: compare-and-swap retries
(``discovery.updates``), store reconnects and watch re-establishment (``store/``),
re-registration (``discovery.registration``), the daemon's engine streams
(``boundary/``), the demo's supervised workers.
"""

from __future__ import annotations

import asyncio
import random


class Backoff:
    """Capped exponential delays with full jitter; see the module docstring.

    ``first``: the bound of the first delay after a reset; ``cap``: the largest bound.
    ``rng``: a seeded ``random.Random`` for tests that need repeatable delays.
    """

    def __init__(self, first: float, cap: float, *, rng: random.Random | None = None) -> None:
        if not 0 < first <= cap:
            raise ValueError(f"a back-off needs 0 < first <= cap, got {first} and {cap}")
        self.first = first
        self.cap = cap
        self._rng = rng or random.Random()
        self._attempts = 0

    @property
    def attempts(self) -> int:
        """Delays handed out since the last reset."""
        return self._attempts

    def bound(self) -> float:
        """The bound of the next delay: ``min(cap, first * 2**attempts)``."""
        # min() before the power would overflow after ~1000 attempts of a long outage.
        doublings = min(self._attempts, 64)
        return min(self.cap, self.first * 2.0**doublings)

    def delay(self) -> float:
        """The next delay, in seconds; counts as an attempt."""
        bound = self.bound()
        self._attempts += 1
        return self._rng.uniform(0.0, bound)

    async def wait(self) -> None:
        """Sleep for the next delay."""
        await asyncio.sleep(self.delay())

    def reset(self) -> None:
        """Real progress was made: the next delay is short again."""
        self._attempts = 0
