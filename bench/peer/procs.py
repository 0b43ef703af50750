"""Processes of the peer benchmark that are not ours: Dynamo's, each in its own session.

A ``Detached`` process runs in a new session (so a terminal's Ctrl-C reaches only the
benchmark, which then stops everything in order), writes to a log file, and is started
with ``PR_SET_PDEATHSIG`` = SIGKILL: if the benchmark itself is SIGKILLed, the kernel kills
the process too, so nothing is left behind even then. ``stop()`` signals the whole process
group: SIGTERM, a grace period, then SIGKILL for whatever is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

PR_SET_PDEATHSIG = 1
# Looked up now, not in the child: between fork and exec only the call itself should run.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def _die_with_parent() -> None:
    """Runs in the child between fork and exec."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


LINE_LIMIT = 64 * 1024 * 1024
"""The longest line read from a helper's stdout: one answer carries every latency sample of
a measure (asyncio's default of 64 KiB was too short for a closed-loop run)."""


class Detached:
    """One foreign process, in its own session; see the module docstring."""

    def __init__(
        self, name: str, argv: list[str], env: Mapping[str, str], log: Path, *, talk: bool = False
    ) -> None:
        """``talk``: pipe stdin and stdout, for ``ask()``; stderr still goes to ``log``."""
        self.name, self.argv, self.env, self.log, self.talk = name, argv, dict(env), log, talk
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    async def start(self) -> None:
        pipe, quiet = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL
        with self.log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                env=self.env,
                stdin=pipe if self.talk else quiet,
                stdout=pipe if self.talk else out,
                stderr=out,
                cwd=self.log.parent,
                start_new_session=True,
                preexec_fn=_die_with_parent,
                limit=LINE_LIMIT,
            )

    async def ask(self, line: str) -> str:
        """Write one line to its stdin and read one line of answer from its stdout."""
        assert self.proc is not None and self.proc.stdin and self.proc.stdout, "not talking"
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()
        answer = await self.proc.stdout.readline()
        if not answer:
            await self.proc.wait()
            raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")
        return answer.decode()

    def exited(self) -> int | None:
        """The exit status once it has exited, else None."""
        return None if self.proc is None else self.proc.returncode

    def check_alive(self, waiting_for: str) -> None:
        code = self.exited()
        if code is not None:
            raise RuntimeError(f"{self.name} exited ({code}) while {waiting_for}:\n{self.tail()}")

    async def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM the group, wait up to ``grace`` s, then SIGKILL the group; the exit
        status (negative: the signal that ended it)."""
        if self.proc is None:
            return None
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # a talking helper ends at the end of its input
        if self.proc.returncode is None:
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self.proc.wait()
        self._signal_group(signal.SIGKILL)  # it, if still there, and helpers left in its group
        return await self.proc.wait()

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)  # its own session: the group id is its pid

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return f"(no log at {self.log})"


@contextlib.asynccontextmanager
async def detached(proc: Detached) -> AsyncIterator[Detached]:
    """Start ``proc``; stop it on the way out, a cancellation (Ctrl-C) included."""
    try:
        await proc.start()
        yield proc
    finally:
        await proc.stop()
