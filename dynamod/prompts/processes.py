"""Prompt workers: child processes that read, check and tokenize large requests, so the
daemon's event loop never spends long on one.

Why processes and not threads: the model's tokenizers (Hugging Face's ``encode``, the
mocker's regular expression) and the JSON codec hold the GIL for the whole of a call, so a
thread tokenizing a megabyte-sized prompt stalls the event loop as surely as the loop doing
it itself (``bench/front.py`` measures both). A child process shares nothing: the loop
only copies bytes in and out.

Use::

    async with PromptProcesses(processes=1) as workers:
        head = await workers.read_head(raw)
        routable = await workers.read_prompt(raw, api, tokenizer, model)

Each process has one task in this object that owns it: it starts the process when the
first job comes (``python -m dynamod.prompts.child``), sends it one job at a time from a
shared queue, and restarts it after it died or overran ``job_timeout`` (that job fails
with ``PromptWorkerError``, the request with a retryable 503). A caller that goes away
leaves its job to finish; the answer is dropped. At most ``max_waiting`` jobs wait; one
more is refused at once (``PromptWorkerError``). A tokenizer travels to a process the
first time a job needs it (its bundle, ``tokenizers.bundle``). On exit the processes'
stdin is closed, which ends them; one still busy after ``STOP_WITHIN`` is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from dynamod.errors import InvalidInputError, PromptWorkerError
from dynamod.http.openai import OpenAIApi
from dynamod.prompts import wire
from dynamod.prompts.body import CardLimits, Head, Routable, Tokenized
from dynamod.tasks import cancel_and_wait
from dynamod.tokenizers.bundle import Publishable

log = logging.getLogger(__name__)

PROCESSES = max(1, min(4, (os.cpu_count() or 2) // 2))
"""The daemon's prompt worker processes: half the CPUs (the event loop and the workers'
own processes need the rest), at least one, at most four."""
JOB_TIMEOUT = 60.0
MAX_WAITING = 64
STOP_WITHIN = 2.0


@dataclass
class _Job:
    message: tuple[Any, ...]
    tokenizer: Publishable | None
    done: asyncio.Future[Any] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class PromptProcesses:
    """``processes`` prompt worker processes; see the module docstring."""

    def __init__(
        self,
        processes: int = 1,
        *,
        job_timeout: float = JOB_TIMEOUT,
        max_waiting: int = MAX_WAITING,
    ) -> None:
        if processes < 1:
            raise InvalidInputError(f"prompt workers need at least 1 process, got {processes}")
        self._processes = processes
        self._timeout = job_timeout
        self._queue: asyncio.Queue[_Job] = asyncio.Queue(max_waiting)
        self._owners: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Self:
        self._owners = [
            asyncio.create_task(_Owner(self._queue, self._timeout).run(), name=f"prompt worker {i}")
            for i in range(self._processes)
        ]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for owner in self._owners:
            await cancel_and_wait(owner)
        while not self._queue.empty():
            job = self._queue.get_nowait()
            if not job.done.done():
                job.done.set_exception(PromptWorkerError("the daemon is stopping"))

    async def read_head(self, raw: bytes) -> Head:
        found: Head = await self._run(("head", raw), None)
        return found

    async def read_prompt(
        self, raw: bytes, api: OpenAIApi, tokenizer: Publishable, model: CardLimits
    ) -> Routable:
        job = ("prepare", raw, api.kind, tokenizer.checksum, model)
        found: Routable = await self._run(job, tokenizer)
        return found

    async def tokenize_text(self, text: str, tokenizer: Publishable, block_size: int) -> Tokenized:
        job = ("tokenize", text, tokenizer.checksum, block_size)
        found: Tokenized = await self._run(job, tokenizer)
        return found

    async def _run(self, message: tuple[Any, ...], tokenizer: Publishable | None) -> Any:
        job = _Job(message, tokenizer)
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            raise PromptWorkerError(
                f"{self._queue.maxsize} large requests are already waiting for the prompt "
                "workers; retry later"
            ) from None
        return await job.done


class _Owner:
    """One worker process and the task that feeds it."""

    def __init__(self, queue: asyncio.Queue[_Job], timeout: float) -> None:
        self._queue = queue
        self._timeout = timeout
        self._proc: asyncio.subprocess.Process | None = None

    async def run(self) -> None:
        try:
            while True:
                job = await self._queue.get()
                if job.done.done():  # its caller went away while it waited
                    continue
                try:
                    await self._serve(job)
                finally:
                    if not job.done.done():  # this task was cancelled: the daemon stops
                        job.done.set_exception(PromptWorkerError("the daemon is stopping"))
        finally:
            await self._stop()

    async def _serve(self, job: _Job) -> None:
        try:
            kind, value = await self._ask(job)
        except PromptWorkerError as exc:
            await self._kill()
            kind, value = "error", exc
        if job.done.done():  # its caller went away: the answer is dropped
            return
        if kind == "ok":
            job.done.set_result(value)
        else:
            job.done.set_exception(value)

    async def _ask(self, job: _Job) -> tuple[str, Any]:
        """The job's answer; a tokenizer the process lacks is sent first."""
        answer = await self._exchange(job.message)
        if answer[0] == "need" and job.tokenizer is not None:
            await self._exchange(("tokenizer", job.tokenizer.checksum, job.tokenizer.bundle()))
            answer = await self._exchange(job.message)
        if answer[0] == "need":
            raise PromptWorkerError(f"the prompt worker lacks tokenizer {answer[1]}")
        return answer

    async def _exchange(self, message: tuple[Any, ...]) -> tuple[str, Any]:
        proc = await self._started()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            async with asyncio.timeout(self._timeout):
                proc.stdin.write(wire.encode(message))
                await proc.stdin.drain()
                prefix = await proc.stdout.readexactly(wire.PREFIX)
                answer: tuple[str, Any] = wire.decode(
                    await proc.stdout.readexactly(wire.length(prefix))
                )
        except TimeoutError:
            raise PromptWorkerError(
                f"preparing the request took the prompt worker longer than {self._timeout:g} s"
            ) from None
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            code = await _exit_code(proc)
            raise PromptWorkerError(
                f"the prompt worker (pid {proc.pid}) exited ({code}) while preparing the "
                f"request: {type(exc).__name__}"
            ) from None
        return answer

    async def _started(self) -> asyncio.subprocess.Process:
        if self._proc is None or self._proc.returncode is not None:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "dynamod.prompts.child",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=2**16,
            )
            log.info("prompt worker started: pid %d", self._proc.pid)
        return self._proc

    async def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()

    async def _stop(self) -> None:
        """Close the process's stdin (it ends), then wait; kill it past ``STOP_WITHIN``."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            async with asyncio.timeout(STOP_WITHIN):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()
        # The pipes' transports close with the process; nothing is left to the collector.
        with contextlib.suppress(ConnectionError):
            if proc.stdin is not None:
                await proc.stdin.wait_closed()


async def _exit_code(proc: asyncio.subprocess.Process) -> str:
    try:
        async with asyncio.timeout(1.0):
            code = await proc.wait()
    except TimeoutError:
        return "still running"
    return f"exit code {code}"
