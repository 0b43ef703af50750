"""Keys from the terminal, for ``dynamoctl top``: ``KeyReader`` puts stdin in cbreak mode (each
key as it is pressed, no echo; Ctrl-C still raises SIGINT) and hands the keys pressed to an
asyncio queue, with ``"resize"`` when the window changes size (SIGWINCH). Leaving it puts
the terminal back exactly as it was, however the command ends.

``names(data)`` turns the bytes of one read into key names: printable characters as they
are, ``up``, ``down``, ``pgup``, ``pgdn``, ``home``, ``end``, ``enter``, ``escape``,
``backspace``; anything else is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import termios
import tty
from collections.abc import Iterator

SEQUENCES = {
    b"\x1b[A": "up", b"\x1b[B": "down", b"\x1b[5~": "pgup", b"\x1b[6~": "pgdn",
    b"\x1b[H": "home", b"\x1b[F": "end", b"\x1bOH": "home", b"\x1bOF": "end",
    b"\x1b[1~": "home", b"\x1b[4~": "end", b"\x1bOA": "up", b"\x1bOB": "down",
}  # fmt: skip
SINGLE = {b"\r": "enter", b"\n": "enter", b"\x7f": "backspace", b"\x08": "backspace"}


def names(data: bytes) -> list[str]:
    """The keys in ``data`` (see the module docstring)."""
    found: list[str] = []
    rest = data
    while rest:
        sequence = next((s for s in SEQUENCES if rest.startswith(s)), None)
        if sequence is not None:
            found.append(SEQUENCES[sequence])
            rest = rest[len(sequence) :]
            continue
        if rest.startswith(b"\x1b["):  # an escape sequence we do not know: skip it whole
            end = next((i for i, b in enumerate(rest[2:], 2) if 0x40 <= b <= 0x7E), len(rest))
            rest = rest[end + 1 :]
            continue
        one, rest = rest[:1], rest[1:]
        if one == b"\x1b":
            found.append("escape")
        elif one in SINGLE:
            found.append(SINGLE[one])
        elif 0x20 <= one[0] < 0x7F:
            found.append(one.decode())
    return found


class KeyReader:
    """The keys pressed, while the ``with`` block runs; see the module docstring.

    ``get()`` waits for the next key. On a stdin that is no terminal nothing is ever
    pressed (only ``"resize"`` comes)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def get(self) -> str:
        return await self.queue.get()

    @contextlib.contextmanager
    def reading(self) -> Iterator[KeyReader]:
        loop = self._loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGWINCH, self.queue.put_nowait, "resize")
        try:
            with self._cbreak(loop):
                yield self
        finally:
            loop.remove_signal_handler(signal.SIGWINCH)

    @contextlib.contextmanager
    def _cbreak(self, loop: asyncio.AbstractEventLoop) -> Iterator[None]:
        if not sys.stdin.isatty():
            yield
            return
        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd)
        tty.setcbreak(fd)
        loop.add_reader(fd, self._read, fd)
        try:
            yield
        finally:
            loop.remove_reader(fd)  # a no-op when it was removed at the end of input
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)

    def _read(self, fd: int) -> None:
        try:
            data = os.read(fd, 1024)
        except OSError:
            data = b""
        if not data:  # the terminal went away: as if q were pressed, once
            if self._loop is not None:
                self._loop.remove_reader(fd)
            self.queue.put_nowait("q")
            return
        for name in names(data):
            self.queue.put_nowait(name)
