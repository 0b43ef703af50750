"""Real subprocesses of the product (dynamo-worker, dynamod, dynamoctl) for tests.

``Proc`` (asyncio): a process started with its stdout piped; ``start()`` waits for its
readiness line (with a deadline, and the stderr tail in the failure message). ``stop(sig)``
signals it and returns the exit code; ``stderr`` holds everything it wrote there.
``Spawned`` is its synchronous twin for module-scoped fixtures, hypothesis tests and
threads: its stderr goes to a file that ``finish()`` checks for tracebacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from dynamod.tasks import cancel_and_wait

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
BAD_STDERR = ("Traceback", "Task was destroyed", "Exception ignored", "Error in atexit")


def env(**extra: str) -> dict[str, str]:
    """The environment for product processes: ours, plus the repo on the path."""
    base = dict(os.environ)
    base["PYTHONPATH"] = str(ROOT)
    base.pop("NOTIFY_SOCKET", None)
    base.update(extra)
    return base


class Proc:
    """One running product process; see the module docstring."""

    def __init__(
        self,
        argv: list[str],
        ready: str,
        extra_env: dict[str, str] | None = None,
        *,
        group: bool = False,
    ):
        """``group``: start it in a process group of its own, which ``kill`` ends whole
        (a vLLM worker's engine processes outlive a killed worker otherwise)."""
        self.argv = argv
        self.group = group
        self.ready_pattern = re.compile(ready)
        self.extra_env = extra_env or {}
        self.proc: asyncio.subprocess.Process | None = None
        self.ready_line = ""
        self.stdout_lines: list[str] = []
        self.stderr = ""
        self._stderr_grew = asyncio.Condition()
        self._stderr_task: asyncio.Task[None] | None = None
        self._stdout_task: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self, within: float = 30.0) -> Proc:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL,
            env=env(**self.extra_env),
            start_new_session=self.group,
        )
        self._stderr_task = asyncio.create_task(self._read_stderr())
        try:
            async with asyncio.timeout(within):
                await self._wait_ready()
        except TimeoutError:
            await self.kill()
            raise AssertionError(
                f"{self.argv[0]} not ready in {within} s:\n{self.stderr}"
            ) from None
        self._stdout_task = asyncio.create_task(self._read_stdout())
        return self

    async def _wait_ready(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            raw = await self.proc.stdout.readline()
            if not raw:
                await self.proc.wait()
                if self._stderr_task is not None:
                    await self._stderr_task
                raise AssertionError(
                    f"{self.argv[0]} exited {self.proc.returncode} before ready:\n{self.stderr}"
                )
            line = raw.decode().rstrip("\n")
            self.stdout_lines.append(line)
            if self.ready_pattern.search(line):
                self.ready_line = line
                return

    async def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for raw in self.proc.stdout:
            self.stdout_lines.append(raw.decode().rstrip("\n"))

    async def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        async for raw in self.proc.stderr:
            self.stderr += raw.decode(errors="replace")
            async with self._stderr_grew:
                self._stderr_grew.notify_all()

    async def logged(self, text: str, within: float = 10.0) -> None:
        """Wait until the process has written ``text`` to stderr."""
        async with asyncio.timeout(within), self._stderr_grew:
            await self._stderr_grew.wait_for(lambda: text in self.stderr)

    def field(self, name: str) -> str:
        match = re.search(rf"\b{name}=(\S+)", self.ready_line)
        assert match, f"no {name}= in {self.ready_line!r}"
        return match.group(1)

    def send(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    async def wait(self, within: float = 30.0) -> int:
        assert self.proc is not None
        async with asyncio.timeout(within):
            code = await self.proc.wait()
            for task in (self._stderr_task, self._stdout_task):
                if task is not None:
                    await task
        return code

    async def stop(self, sig: signal.Signals = signal.SIGTERM, within: float = 30.0) -> int:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(sig)
        return await self.wait(within)

    async def close(self, within: float = 60.0) -> None:
        """SIGTERM and wait up to ``within`` seconds (a worker drains, a ``--launch``ing
        worker stops its server), then ``kill`` whatever is left."""
        if self.proc is None:
            return
        with contextlib.suppress(TimeoutError, ProcessLookupError):
            await self.stop(signal.SIGTERM, within)
        await self.kill()

    async def kill(self) -> None:
        if self.proc is None:
            return
        if self.group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        elif self.proc.returncode is None:
            self.proc.kill()
        with contextlib.suppress(TimeoutError):
            await self.wait(10)
        for task in (self._stderr_task, self._stdout_task):
            if task is not None and not task.done():
                await cancel_and_wait(task)

    def assert_clean_stderr(self) -> None:
        for bad in BAD_STDERR:
            assert bad not in self.stderr, f"{bad!r} on stderr of {self.argv[0]}:\n{self.stderr}"


READY_WITHIN = 30.0


class Lines:
    """Lines from a pipe, each wait bounded by a deadline. Reads the raw fd: a buffered
    file object would hide lines that ``select`` cannot see."""

    def __init__(self, fd: int, what: object) -> None:
        self.fd = fd
        self.what = what
        self.buffer = b""

    def next(self, within: float) -> str | None:
        """The next line; None at the end of the stream."""
        deadline = time.monotonic() + within
        while b"\n" not in self.buffer:
            readable, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))
            assert readable, f"no line from {self.what} in {within} s"
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode()


class Spawned:
    """One product process (a daemon, a worker) for synchronous tests: module-scoped
    fixtures, hypothesis, threads. Its stderr goes to ``log``; ``wait_ready()`` reads its
    stdout up to the readiness line (``started()`` does both). ``stop(sig)`` signals it and
    returns its exit code; ``finish()`` stops it with SIGTERM and returns its stderr,
    asserted free of tracebacks."""

    def __init__(
        self, argv: Sequence[str], ready: str, log: Path, extra_env: dict[str, str] | None = None
    ) -> None:
        self.log_path = log
        self._log = log.open("w")
        self.program = argv[0]
        self.proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            env=env(**(extra_env or {})),
        )
        self.ready_pattern = re.compile(ready)
        self.ready_line = ""

    def wait_ready(self) -> Spawned:
        assert self.proc.stdout is not None
        lines = Lines(self.proc.stdout.fileno(), self.proc.args)
        try:
            while (line := lines.next(READY_WITHIN)) is not None:
                if self.ready_pattern.search(line):
                    self.ready_line = line.strip()
                    return self
        except AssertionError:
            self.kill()
            raise AssertionError(f"{self.program} not ready in time:\n{self.log}") from None
        self.proc.wait()
        self.kill()
        raise AssertionError(f"{self.program} exited {self.proc.returncode}:\n{self.log}")

    @property
    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def field(self, name: str) -> str:
        match = re.search(rf"\b{name}=(\S+)", self.ready_line)
        assert match, f"no {name}= in {self.ready_line!r}"
        return match.group(1)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        """Signal it, wait for it (killing it past 30 s), and its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=30)
        finally:
            self.kill()

    def finish(self) -> str:
        """SIGTERM, wait, and the stderr it wrote, asserted free of tracebacks."""
        self.stop()
        text = self.log
        for bad in BAD_STDERR:
            assert bad not in text, f"{bad!r} on stderr of {self.program}:\n{text}"
        return text

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


def started(
    argv: Sequence[str], ready: str, log: Path, extra_env: dict[str, str] | None = None
) -> Spawned:
    """A ``Spawned`` process, once it printed its readiness line."""
    return Spawned(argv, ready, log, extra_env).wait_ready()


def worker_argv(store_url: str, model: str = "llama", *args: str) -> list[str]:
    return [
        str(BIN / "dynamo-worker"),
        "--model", model,
        "--store", store_url,
        "--lease-ttl", "2",
        "--speedup-ratio", "50",
        *args,
    ]  # fmt: skip


@contextlib.asynccontextmanager
async def running(proc: Proc) -> AsyncIterator[Proc]:
    """Start ``proc``; on exit SIGKILL it if it is still running."""
    await proc.start()
    try:
        yield proc
    finally:
        await proc.kill()


def worker(store_url: str, *args: str, model: str = "llama", **env: str) -> Proc:
    return Proc(worker_argv(store_url, model, *args), r"^dynamo-worker ready:", env)


def daemon_argv(store_url: str, socket: Path, *args: str) -> list[str]:
    return [
        str(BIN / "dynamod"),
        "--store", store_url,
        "--listen", f"unix://{socket}",
        "--http", "127.0.0.1:0",
        "--audit-log", str(socket.parent / "audit.log"),
        "--grace", "5",
        *args,
    ]  # fmt: skip


def daemon(store_url: str, socket: Path, *args: str, **env: str) -> Proc:
    """A real ``dynamod`` process; ready once it prints its readiness line."""
    return Proc(daemon_argv(store_url, socket, *args), r"^dynamod ready:", env)


def dynamoctl(*args: str) -> list[str]:
    return [str(BIN / "dynamoctl"), *args]


async def run_ctl(socket: Path, *args: str, within: float = 120) -> tuple[int, str]:
    """Run ``dynamoctl`` against the daemon at ``socket``; its exit status and stderr."""
    process = await asyncio.create_subprocess_exec(
        *dynamoctl("--endpoint", f"unix://{socket}", *args),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env(),
    )  # fmt: skip
    async with asyncio.timeout(within):
        _, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, err.decode()
