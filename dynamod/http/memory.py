"""One memory budget for what the daemon holds of its peers' bytes, in total.

Each read is bounded on its own (``bounded.py``, ``sse.py``), but many at once are not: 30
clients that never read a relayed stream, many whole answers read together, 8 tokenizer
bundles fetched at once, thousands of engine events lines each stay within their own
bound and together take gigabytes.
``MemoryBudget`` is the account all of them draw on (the daemon's ``memory_budget_mb``):
each holder takes a ``Claim`` and moves its bytes on it as they arrive and leave — a
counter added to and subtracted from, nothing more per chunk. Only when the total passes
the limit is anything looked at: the claim holding the most pays first. Its bytes leave
the account at once, one line is logged, its ``stop`` is called (the holder's own way
out: close the worker's connection, abort the client's), and its next ``add`` raises
``MemoryBudgetError``; when the claim adding is itself the largest, that ``add`` raises.
A claim that holds nothing is not in the account, so opening one costs nothing there.

The holders: the front's relayed streams (the event being written and what waits in the
client's socket buffer), its whole answers (read, and held until written to the client),
the tokenizer bundles being fetched (``boundary/tokenizer_registry.py``) and what waits in
each engine events connection's buffer (``boundary/engine_streams.py``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Final

from dynamod.errors import MemoryBudgetError

log = logging.getLogger(__name__)

MIB: Final = 1 << 20
DEFAULT_LIMIT: Final = 512 * MIB
"""The daemon's ``memory_budget_mb`` by default: 4 whole answers at their limit held for
clients (a read answer counts twice: its body and the copy in the client's socket buffer),
or 4 tokenizer bundles at theirs, or the 256 MiB the relayed streams had alone before,
twice."""
SETTING: Final = "memory_budget_mb"


def _nothing(error: MemoryBudgetError) -> None:
    return None


class Claim:
    """One holder's bytes in a ``MemoryBudget``; see the module docstring. ``stop`` is
    called with the refusal when the budget makes this claim pay, which may be while its
    holder waits elsewhere (it must not block: close a connection, abort a transport)."""

    __slots__ = ("_budget", "name", "refused", "size", "stop")

    def __init__(self, budget: MemoryBudget, name: str) -> None:
        self._budget = budget
        self.name = name
        self.size = 0
        self.refused: MemoryBudgetError | None = None
        self.stop: Callable[[MemoryBudgetError], None] = _nothing

    def add(self, size: int) -> None:
        """``size`` more bytes held (fewer when negative); ``MemoryBudgetError`` when this
        claim was made to pay, now or before."""
        if self.refused is not None:
            raise self.refused
        self._budget._moved(self, size)

    def resize(self, size: int) -> None:
        """This claim holds ``size`` bytes now; as ``add``."""
        self.add(size - self.size)

    def release(self) -> None:
        """This claim holds nothing any more (its holder is done)."""
        if self.size:
            self._budget._moved(self, -self.size)


class MemoryBudget:
    """The account of bytes held from peers, at most ``limit`` in all; see the module
    docstring. ``on_refused`` is told of each claim made to pay (a metric)."""

    def __init__(
        self, limit: int = DEFAULT_LIMIT, on_refused: Callable[[], None] | None = None
    ) -> None:
        if limit < 1:
            raise ValueError(f"a memory budget must be at least 1 byte, got {limit}")
        self.limit = limit
        self._on_refused = on_refused
        self.held = 0
        """Bytes all claims hold now."""
        self.refusals = 0
        """Claims made to pay since start."""
        self._claims: set[Claim] = set()

    @contextlib.contextmanager
    def claim(self, name: str) -> Iterator[Claim]:
        """A claim for one holder (``name``: ``the answer of worker 1a2b``), released on
        leaving."""
        claim = Claim(self, name)
        try:
            yield claim
        finally:
            claim.release()

    def _moved(self, claim: Claim, size: int) -> None:
        was = claim.size
        claim.size = was + size
        self.held += size
        if not claim.size:
            self._claims.discard(claim)
        elif not was:
            self._claims.add(claim)
        if size > 0 and self.held > self.limit:
            self._pay(claim)

    def _pay(self, adding: Claim) -> None:
        """While over the limit, the largest claim pays; raises when that is ``adding``."""
        while self.held > self.limit:
            largest = max(self._claims, key=_size)
            error = self._refusal(largest)
            self._moved(largest, -largest.size)
            largest.refused = error
            self.refusals += 1
            if self._on_refused is not None:
                self._on_refused()
            log.warning("%s", error)
            largest.stop(error)
            if largest is adding:
                raise error

    def _refusal(self, largest: Claim) -> MemoryBudgetError:
        return MemoryBudgetError(
            f"{largest.name} is refused: the daemon holds {self.held} bytes from its peers "
            f"(answers, streams, tokenizer bundles, engine events), over its memory budget "
            f"of {self.limit} ({SETTING} = {self.limit / MIB:g}), and it held the most "
            f"({largest.size} bytes); "
            f"retry later, or raise {SETTING}",
            limit=self.limit,
        )


def _size(claim: Claim) -> int:
    return claim.size
