"""The file store's exclusive lock: ``flock`` on one file, awaited without blocking the loop.

A blocking ``flock`` would stall the event loop, and one in a thread could not be cancelled,
so ``acquire`` tries without blocking and backs off (jittered, capped); the caller puts a
deadline around it.
The kernel drops the lock when the holding process dies, however it dies, which is what
makes a killed writer harmless.

One descriptor serves a whole process: ``flock`` does not exclude holders of the same open
file, so callers must never hold the lock across an ``await`` (the file store runs every
critical section as one synchronous call).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from dynamod.backoff import Backoff
from dynamod.errors import StoreClosedError

BACKOFF_FIRST = 0.001
BACKOFF_CAP = 0.01


class FileLock:
    """An exclusive ``flock`` on ``path``, usable once ``open()`` created the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = -1

    def open(self) -> None:
        """Open (creating) the lock file; ``OSError`` when that fails."""
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)

    async def acquire(self) -> None:
        """Take the lock, however long that takes: the caller bounds it with a deadline.
        ``StoreClosedError`` once ``close()`` ran."""
        backoff = Backoff(BACKOFF_FIRST, BACKOFF_CAP)
        while not self._try():
            await backoff.wait()

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the descriptor (which drops the lock). Idempotent."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def _try(self) -> bool:
        if self._fd < 0:
            # The descriptor number may already belong to another file: never flock it.
            raise StoreClosedError(f"store lock {self.path} is not open (its store is closed)")
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
