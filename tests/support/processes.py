"""Real subprocesses of the product (dynamo-worker, dynamod, dynamoctl) for tests.

``Proc`` (asyncio): a process started with its stdout piped; ``start()`` waits for its
readiness line (with a deadline, and the stderr tail in the failure message). ``stop(sig)``
signals it and returns the exit code; ``stderr`` holds everything it wrote there.
``Started`` is its synchronous twin for module-scoped fixtures and hypothesis tests: its
stderr goes to a file that ``stop()`` checks for tracebacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

from dynamod.tasks import cancel_and_wait

ROOT = Path(__file__).resolve().parent.parent
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


class Started:
    """One product process, ready; ``stop()`` ends it and checks its stderr."""

    def __init__(
        self, argv: list[str], ready: str, log: Path, extra_env: dict[str, str] | None = None
    ) -> None:
        self.log = log
        self.program = argv[0]
        with log.open("wb") as err:
            self.proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=env(**(extra_env or {})),
            )
        try:
            self.ready_line = self._ready(re.compile(ready))
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            raise

    def _ready(self, pattern: re.Pattern[str]) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + READY_WITHIN
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not selector.select(deadline - time.monotonic()):
                    continue
                line = self.proc.stdout.readline().decode()
                if not line:
                    break
                if pattern.search(line):
                    return line
        raise AssertionError(f"{self.program} not ready:\n{self.log.read_text()}")

    def field(self, name: str) -> str:
        match = re.search(rf"\b{name}=(\S+)", self.ready_line)
        assert match, f"no {name}= in {self.ready_line!r}"
        return match.group(1)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> str:
        """SIGTERM, wait, and the stderr it wrote (asserted free of tracebacks)."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        text = self.log.read_text(errors="replace")
        for bad in BAD_STDERR:
            assert bad not in text, f"{bad!r} on stderr of {self.program}:\n{text}"
        return text


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
