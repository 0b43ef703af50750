"""How many server streams the API keeps open at once: in all, and for one caller.

A server stream (``TailEvents``, ``StreamWorkers``, ``StreamUpdateTaints``) holds the
message it is writing until its client reads it — a ``RESYNC`` of the whole view or a
page of a listing can be megabytes — and a client that never reads holds it for as long
as the stream stays open. ``StreamSlots`` bounds how many are open at once: ``limit`` in
all, ``per_caller`` for one principal (one token, one client certificate, or the unix
socket). What unread streams can make the daemon hold is then at most that many messages
(and the event queues' own byte budget, ``discovery/view.py``). A stream past either
bound is refused at once with ``StreamLimitError`` (``RESOURCE_EXHAUSTED``, retryable),
naming the bound and the setting that changes it; the streams already open are not
touched.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

from dynamod.auth import Principal
from dynamod.errors import StreamLimitError


class StreamSlots:
    """Open streams, counted in all and by caller; see the module docstring."""

    def __init__(self, limit: int, per_caller: int) -> None:
        """``limit`` streams in all, ``per_caller`` for one principal (the settings
        ``max_streams`` and ``max_streams_per_caller``)."""
        self.limit = limit
        self.per_caller = per_caller
        self._open: Counter[str] = Counter()

    def __len__(self) -> int:
        return self._open.total()

    @contextlib.contextmanager
    def hold(self, caller: Principal) -> Iterator[None]:
        """One slot for ``caller`` while the block runs; ``StreamLimitError`` when none is
        free."""
        self._check(caller.name)
        self._open[caller.name] += 1
        try:
            yield
        finally:
            self._open[caller.name] -= 1
            if not self._open[caller.name]:
                del self._open[caller.name]

    def _check(self, name: str) -> None:
        if len(self) >= self.limit:
            raise StreamLimitError(
                f"dynamod already has {len(self)} API streams open (event tails, watches, drain "
                f"waits, streamed listings and updates), its limit (max_streams = {self.limit}); "
                "retry when one has ended",
                "max_streams",
                self.limit,
            )
        if self._open[name] >= self.per_caller:
            raise StreamLimitError(
                f"{name!r} already has {self._open[name]} API streams open, the limit for one "
                f"caller (max_streams_per_caller = {self.per_caller}); end one (an events tail, "
                "a watch or a drain wait) and retry",
                "max_streams_per_caller",
                self.per_caller,
            )
