"""The client's drain at interpreter exit, for scripts that forget to close a client.

A client registers itself here when it is made and leaves when it is closed. At exit
(``atexit``: after the main thread finished and non-daemon threads were joined, before the
interpreter tears down), every client still open is closed under one deadline, the same
bound as the programs' own drain (``dynamod.lifecycle.exit_drain_seconds()``: 250 ms by
default, ``DYNAMO_DRAIN=0`` turns it off): a blocking ``Client`` stops its event-loop
thread, an ``AsyncClient`` whose loop can still run closes its calls and channel. What is
still alive at the deadline is logged (warning), then left alone: the interpreter exits
around it, as it would have without the drain. This is Dynamo's drain of its bridge tasks
before interpreter finalization (PR #14813), for this client.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from typing import Protocol

from dynamod.lifecycle import exit_drain_seconds

log = logging.getLogger(__name__)


class Drainable(Protocol):
    def drain_at_exit(self, deadline: float) -> list[str]:
        """Close what can be closed before ``deadline`` (``time.monotonic()``); return a
        description of whatever is still open."""
        ...  # pragma: no cover - a protocol


_open: weakref.WeakSet[Drainable] = weakref.WeakSet()
_lock = threading.Lock()
_registered = False


def track(client: Drainable) -> None:
    """Drain ``client`` at exit unless it is closed first (``forget``)."""
    global _registered
    with _lock:
        _open.add(client)
        if not _registered:
            atexit.register(drain_all)
            _registered = True


def forget(client: Drainable) -> None:
    with _lock:
        _open.discard(client)


def drain_all(seconds: float | None = None) -> list[str]:
    """Close every client still open within ``seconds`` (default: the exit drain bound);
    log and return what remains."""
    bound = exit_drain_seconds() if seconds is None else seconds
    with _lock:
        clients = list(_open)
    if bound <= 0 or not clients:
        return []
    deadline = time.monotonic() + bound
    log.debug("closing %d client(s) left open at exit, within %gs", len(clients), bound)
    remaining: list[str] = []
    for client in clients:
        remaining += client.drain_at_exit(deadline)
    for name in remaining:
        log.warning("still open at exit, left as is: %s", name)
    return remaining
