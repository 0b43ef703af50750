"""The pool leader's memory of failed moves: a back-off per worker, and refused moves.

A move that failed for a reason that may pass (the store or the worker's route did not
answer, a timeout) is tried again after a delay of its own worker: 1 s after the first
failure, doubling with each further one up to 60 s (``FIRST``, ``CAP``), and only a move of
that worker that succeeds resets it. A move the daemon *refused* (``is_permanent``: the update
is invalid, over the daemon's taint limits, not permitted, or not supported by the worker)
would be refused again just the same, so it is not tried again until something it depends
on changes: the policy (its revision), the worker's record (its revision) or the daemon's
settings (a reload). Either way the round leaves the worker out and asks to run again when
its next attempt is due (``due``), so a move refused every time costs one attempt per
change, and a failing one at most one per back-off delay.

Pure, like ``MoveBudget``: the caller passes its clock's reading (``loop.time()``) and the
wall clock for what ``pools status`` shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, NamedTuple

from dynamod.errors import AccessError, DynamoError, InvalidInputError, UnsupportedError
from dynamod.pool_results import MoveFailure

FIRST: Final = 1.0
CAP: Final = 60.0
"""Seconds before the next attempt of a worker's failed move: ``FIRST``, doubling, capped."""
PERMANENT: Final = (InvalidInputError, AccessError, UnsupportedError)
"""Refusals that come back the same until something changes."""
MAX_ERROR: Final = 500
"""Characters of an error kept (a worker's answer may be in it)."""


class Basis(NamedTuple):
    """What a refused move depended on: it is tried again once any of these differs."""

    policy_revision: int
    record_revision: int
    settings: int


def is_permanent(exc: DynamoError) -> bool:
    return isinstance(exc, PERMANENT)


def delay_after(attempts: int) -> float:
    """The delay after the ``attempts``-th failure in a row (1-based)."""
    return min(CAP, FIRST * 2.0 ** min(attempts - 1, 64))


@dataclass
class _Failed:
    policy: str
    to_pool: str
    error: str
    attempts: int
    due: float | None
    """Loop time of the next attempt; None while refused (``basis`` unchanged)."""
    next_time: float
    """Wall-clock time of the next attempt (0 while refused), for ``status``."""
    basis: Basis


class MoveFailures:
    """Each worker's failed moves in one term (see the module docstring)."""

    def __init__(self) -> None:
        self._failed: dict[str, _Failed] = {}

    def __len__(self) -> int:
        return len(self._failed)

    def failed(
        self,
        worker: str,
        policy: str,
        to_pool: str,
        exc: DynamoError,
        basis: Basis,
        *,
        now: float,
        wall: float,
    ) -> float | None:
        """Record a failed move of ``worker``; the loop time of its next attempt (None when
        refused: not before something changes)."""
        attempts = self._failed[worker].attempts + 1 if worker in self._failed else 1
        if is_permanent(exc):
            due, next_time = None, 0.0
        else:
            delay = delay_after(attempts)
            due, next_time = now + delay, wall + delay
        error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR]
        self._failed[worker] = _Failed(policy, to_pool, error, attempts, due, next_time, basis)
        return due

    def succeeded(self, worker: str) -> None:
        """A move of ``worker`` committed: its back-off starts over."""
        self._failed.pop(worker, None)

    def holds(self, worker: str, basis: Basis, now: float) -> bool:
        """Whether a move of ``worker`` must wait: its back-off has not run out, or it was
        refused and nothing it depended on changed."""
        failed = self._failed.get(worker)
        if failed is None:
            return False
        if failed.due is None:
            return failed.basis == basis
        return now < failed.due

    def due(self) -> float | None:
        """The loop time of the earliest next attempt (refused moves have none)."""
        times = [f.due for f in self._failed.values() if f.due is not None]
        return min(times) if times else None

    def keep_only(self, policy: str, workers: set[str]) -> None:
        """Forget the failures of ``policy``'s workers that it no longer owns."""
        for worker in [w for w, f in self._failed.items() if f.policy == policy]:
            if worker not in workers:
                del self._failed[worker]

    def of(self, policy: str) -> tuple[MoveFailure, ...]:
        """The failing workers of ``policy``, by worker id, for ``pools status``."""
        return tuple(
            MoveFailure(worker, f.to_pool, f.error, f.attempts, f.next_time, f.due is None)
            for worker, f in sorted(self._failed.items())
            if f.policy == policy
        )
