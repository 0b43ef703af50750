"""The audit log: one JSON line per mutation, appended and flushed at once.

Each taint change's line: ``time`` (RFC 3339, UTC), ``source`` (the path it came by:
``dynamod``, ``worker-route`` — a worker's own route — or ``worker``, in its process),
``caller`` (the token's name), ``peer`` (where the call came from, as the transport names
it: ``ipv4:10.0.0.7:51234`` on TCP, ``unix:`` on the socket),
``action``, ``taints``, ``keys``, ``worker``, ``before``, ``after``, ``revision``,
``outcome`` (``ok``, ``unchanged``, or the error code) and, on failure, ``error``. ``time``
is when the line was written, after the outcome was known; ``sent``, where a write was
sent, is when it left for the store (or a worker's route), after every check: a pool
leader paused between the two writes lines whose ``time`` is late but whose ``sent``
falls in its term. A move a pool leader committed and did not live to log is written by
the next leader at its start, with ``reconciled`` (``by``, ``epoch``) beside the dead
leader's ``epoch``, ``leader`` and ``sent`` (``pools/intents.py``). A dry
run is not a mutation and is not logged. A refused attempt (no or a wrong token, no
right, invalid input) is one line too, with the caller as far as known, what was asked
and why it was refused.

The audit line is written after the store has committed the change: a line that cannot be
written (a full disk, a removed directory) does not undo it, and the caller is told what
happened — the change. The failure is loud instead: an ERROR log line naming the change, and
``on_failure`` (the daemon counts ``dynamod_audit_failures_total``).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)


def now() -> str:
    """The time as an audit line writes it: RFC 3339, UTC, to the millisecond."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def at(seconds: float) -> str:
    """A unix time as an audit line writes it (``now``)."""
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="milliseconds")


class AuditLog:
    def __init__(self, path: Path | None, on_failure: Callable[[], None] = lambda: None) -> None:
        self.path = path
        self._file: IO[str] | None = None
        self._on_failure = on_failure

    def open(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        self._file = os.fdopen(fd, "a", encoding="utf-8")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def record(self, **fields: Any) -> None:
        line = json.dumps({"time": now(), **fields}, sort_keys=False)
        if self._file is None:
            log.info("audit %s", line)
            return
        try:
            self._file.write(line + "\n")
            self._file.flush()
        except OSError as exc:
            self._on_failure()
            log.error("audit log %s cannot be written (%s); not recorded: %s", self.path, exc, line)
