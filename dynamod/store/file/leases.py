"""The file store's leases: one small JSON file per lease under ``leases/``.

``leases/<id as 16 hex digits>`` holds ``{"ttl": seconds, "expires": deadline, "boot": id}``.
Deadlines are on ``CLOCK_MONOTONIC`` (``time.monotonic``), which every process of one boot
shares and no wall-clock step moves. That clock restarts with the machine, so a lease also
records the kernel's boot id, and one written before the last reboot has expired. A key's
binding to its lease lives in the key file, not here. Writes go through
``write_atomic`` under the store lock; reads need no lock. Only ``OSError`` and
``StoreError`` leave this module.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import time
from pathlib import Path

from dynamod.errors import StoreError
from dynamod.store.base import Lease
from dynamod.store.file.keys import write_atomic

_LEASE_NAME = re.compile(r"[0-9a-f]{16}")
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    """This boot's id (Linux); ``""`` where the kernel does not say, which matches itself."""
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""


class LeaseFiles:
    """The lease files in ``directory``; ``clock`` is the shared monotonic clock."""

    def __init__(self, directory: Path, tmp_dir: Path) -> None:
        self.directory = directory
        self.tmp_dir = tmp_dir
        self.clock = time.monotonic
        self.boot = boot_id()

    def create(self, ttl: float) -> Lease:
        """A new lease, alive for ``ttl`` seconds. Under the lock (ids are checked unique)."""
        lease_id = 0
        while lease_id == 0 or self._path(lease_id).exists():
            lease_id = secrets.randbits(63)
        self.write(Lease(lease_id, ttl))
        return Lease(lease_id, ttl)

    def write(self, lease: Lease) -> None:
        """(Re)start ``lease``'s TTL from now."""
        body = {"ttl": lease.ttl, "expires": self.clock() + lease.ttl, "boot": self.boot}
        write_atomic(self.tmp_dir, self._path(lease.id), json.dumps(body).encode())

    def find(self, lease_id: int) -> Lease | None:
        """The lease if its file exists and its deadline has not passed."""
        found = self._load(self._path(lease_id))
        if found is None or found[1] <= self.clock():
            return None
        return Lease(lease_id, found[0])

    def remove(self, lease_id: int) -> None:
        self._path(lease_id).unlink(missing_ok=True)

    def deadlines(self) -> dict[int, float]:
        """Every lease's deadline on ``clock``, by lease id."""
        found: dict[int, float] = {}
        for name in os.listdir(self.directory):
            if not _LEASE_NAME.fullmatch(name):
                continue  # not ours; the store never writes other names here
            loaded = self._load(self.directory / name)
            if loaded is not None:
                found[int(name, 16)] = loaded[1]
        return found

    def _load(self, path: Path) -> tuple[float, float] | None:
        """``(ttl, deadline)``, or ``None`` when the file is gone."""
        try:
            body = json.loads(path.read_bytes())
            ttl, expires, boot = float(body["ttl"]), float(body["expires"]), str(body["boot"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            raise StoreError(
                f"lease file {path} is not a lease ({{'ttl': ..., 'expires': ..., 'boot': ...}}); "
                "it was not written by this store: move it away"
            ) from None
        if boot != self.boot:
            return ttl, -math.inf  # the machine restarted since: its clock means nothing now
        return ttl, expires

    def _path(self, lease_id: int) -> Path:
        return self.directory / f"{lease_id:016x}"
