"""Linux inotify through libc, read on the event loop: the file store's change notification.

Why not ``watchfiles``: its async API waits in a worker thread that checks for a stop
request every ``step`` milliseconds (latency and idle wake-ups), and the thread cannot be
cancelled, only asked to stop. A non-blocking inotify descriptor given to
``loop.add_reader`` costs nothing while idle, wakes the loop the moment a file changes,
and closes with the store.

``Inotify()`` raises ``OSError`` where inotify is missing (not Linux) or exhausted
(``fs.inotify.max_user_instances`` / ``max_user_watches``); the caller then polls.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys
from pathlib import Path

IN_MODIFY = 0x00000002
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_Q_OVERFLOW = 0x00004000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name
_READ_SIZE = 64 * 1024


class Inotify:
    """One non-blocking inotify descriptor and the directories it watches, by tag."""

    def __init__(self) -> None:
        if not sys.platform.startswith("linux"):
            raise OSError(errno.ENOSYS, f"inotify is Linux-only; this is {sys.platform}")
        self._libc = ctypes.CDLL(None, use_errno=True)
        # IN_NONBLOCK and IN_CLOEXEC have the values of O_NONBLOCK and O_CLOEXEC.
        self._fd = int(self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
        if self._fd < 0:
            raise _last_error("inotify_init1")
        self._tags: dict[int, str] = {}

    def add(self, directory: Path, mask: int, tag: str) -> None:
        """Report events of ``mask`` on entries of ``directory`` as ``tag``."""
        wd = int(self._libc.inotify_add_watch(self._fd, os.fsencode(directory), mask))
        if wd < 0:
            raise _last_error(f"inotify_add_watch({directory})")
        self._tags[wd] = tag

    def fileno(self) -> int:
        return self._fd

    def drain(self) -> set[str]:
        """Read every pending event; the tags of the directories that changed. A queue
        overflow reports every tag (something changed, we cannot say where)."""
        changed: set[str] = set()
        while True:
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                return changed
            for offset in _event_offsets(data):
                wd, mask, _, _ = _EVENT.unpack_from(data, offset)
                if mask & IN_Q_OVERFLOW:
                    changed.update(self._tags.values())
                elif wd in self._tags:
                    changed.add(self._tags[wd])

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


def _event_offsets(data: bytes) -> list[int]:
    offsets: list[int] = []
    offset = 0
    while offset + _EVENT.size <= len(data):
        offsets.append(offset)
        offset += _EVENT.size + _EVENT.unpack_from(data, offset)[3]
    return offsets


def _last_error(call: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{call} failed: {os.strerror(code)}")
