"""The daemon's open files: its limit raised at start, counted, and kept for what needs it.

The daemon holds one connection per followed worker (its engine events stream) beside its
store, gRPC and front connections. Under systemd a service's soft limit is 1,024 unless
its unit says otherwise (``packaging/systemd/dynamod.service`` sets ``LimitNOFILE``), so a
fleet of a thousand streaming workers would end in ``EMFILE`` anywhere in the process.

* ``raise_limit()`` at start: the soft ``RLIMIT_NOFILE`` up to the hard one (which only
  the administrator can raise), logged with both;
* ``OpenFiles``: the gauges ``dynamod_open_files`` (descriptors open now) and
  ``dynamod_open_files_limit`` (the soft limit), and ``streams``: how many engine streams
  may be open at once, the limit less ``RESERVE`` kept for everything else. The engine
  streams refuse to open more (counted and logged, ``boundary/engine_streams.py``), so a
  fleet beyond the limit costs those workers their stream (the router falls back on its
  own count of their requests), never the store's or a client's connection.
"""

from __future__ import annotations

import logging
import os
import resource
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge

log = logging.getLogger(__name__)

RESERVE = 256
"""Descriptors kept for all but engine streams: the store, gRPC and the front's clients,
the prompt processes' pipes, the log, the audit file."""
NR_OPEN = Path("/proc/sys/fs/nr_open")
FDS = (Path("/proc/self/fd"), Path("/dev/fd"))


@dataclass(frozen=True)
class Limit:
    """``RLIMIT_NOFILE`` at start (``was``) and now (``soft``, ``hard``)."""

    was: int
    soft: int
    hard: int


def raise_limit() -> Limit:
    """Raise the soft limit on open files to the hard one (to the kernel's ``nr_open``
    when the hard one is unlimited); log both. A refusal is logged, not raised: the daemon
    runs within the limit it has."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _ceiling() if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("open files: could not raise the soft limit %d to %d: %s",
                        soft, target, exc)  # fmt: skip
        else:
            log.info("open files: soft limit raised from %d to %d (hard limit %s)",
                     soft, target, _shown(hard))  # fmt: skip
            return Limit(soft, target, hard)
    else:
        log.info("open files: soft limit %s (hard limit %s)", _shown(soft), _shown(hard))
    return Limit(soft, soft, hard)


def soft_limit() -> int:
    """The soft limit on open files now (a large number when unlimited)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return _ceiling() if soft == resource.RLIM_INFINITY else soft


def open_count() -> int:
    """Descriptors this process has open now (-1 where the system does not say)."""
    for folder in FDS:
        try:
            return len(os.listdir(folder)) - 1  # listdir's own descriptor
        except OSError:
            continue
    return -1


class OpenFiles:
    """The daemon's open files against its limit: gauges in ``registry``, and how many
    engine streams fit (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry | None = None, reserve: int = RESERVE) -> None:
        self.reserve = reserve
        if registry is not None:
            Gauge(
                "dynamod_open_files", "File descriptors the daemon has open now.", registry=registry
            ).set_function(open_count)
            Gauge(
                "dynamod_open_files_limit",
                "The daemon's soft limit on open files (RLIMIT_NOFILE).",
                registry=registry,
            ).set_function(soft_limit)

    @property
    def streams(self) -> int:
        """Engine streams that may be open at once: the soft limit less the reserve."""
        return max(0, soft_limit() - self.reserve)


def _ceiling() -> int:
    try:
        return int(NR_OPEN.read_text())
    except (OSError, ValueError):
        return 1 << 20


def _shown(limit: int) -> str:
    return "unlimited" if limit == resource.RLIM_INFINITY else str(limit)
