"""Prompt processes: child processes that read, check and tokenize large requests, so the
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
leaves its job to finish; the answer is dropped. At most ``max_waiting`` jobs, and
``max_waiting_bytes`` of their bodies, wait; one more is refused at once
(``PromptWorkerError``). A tokenizer travels to a process the
first time a job needs it (its bundle's bytes, ``tokenizers.bundle.published``). On exit
the processes' stdin is closed, which ends them; one still busy after ``STOP_WITHIN`` is
killed.

Models' own tokenizers and chat templates run here, never on the daemon's loop, within
``limits`` (``tokenizers.limits.TokenizerLimits``, enforced in the child: ``child.py``).
What a model's tokenizer does wrong is the model's fault, answered as such
(``ModelTemplateError``, a 500 naming the model): it raised or overran a bound, it does not
build here, or the kernel ended the process for its CPU time (``SIGXCPU``: the process is
replaced). ``check_tokenizer`` builds a fetched bundle in a process before the daemon uses
it (``boundary.TokenizerRegistry``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from dynamod.errors import InvalidInputError, PromptWorkerError
from dynamod.http.openai import ModelTemplateError, OpenAIApi
from dynamod.prompts import wire
from dynamod.prompts.body import CardLimits, Head, ReadyRequest, Tokenized
from dynamod.prompts.child import limits_arg
from dynamod.tasks import cancel_and_wait
from dynamod.tokenizers import SimpleTokenizer
from dynamod.tokenizers.bundle import Publishable, TokenizerUnavailableError, published
from dynamod.tokenizers.limits import TokenizerLimits

log = logging.getLogger(__name__)

PROCESSES = max(1, min(4, (os.cpu_count() or 2) // 2))
"""The daemon's prompt processes: half the CPUs (the event loop and the workers'
own processes need the rest), at least one, at most four."""
JOB_TIMEOUT = 60.0
MAX_WAITING = 1024
"""Jobs that may wait: every request for a model with its own tokenizer comes here, so as
many as the router's queue holds (``RouterKnobs.max_queue``)."""
MAX_WAITING_BYTES = 512 * 1024 * 1024
"""Bytes of bodies that may wait: 64 of the largest (8 MiB) bodies."""
STOP_WITHIN = 2.0
CHILD_ENV = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1", "RUST_BACKTRACE": "0"}
"""One job at a time per process: no thread pools (they would also count against the
process's address space and CPU budget); a model's tokenizer that panics is one line on
the daemon's stderr, not a backtrace."""


@dataclass
class _Job:
    message: tuple[Any, ...]
    tokenizer: Publishable | None
    blame: _Blame | None = None
    """Whom a failure of the tokenizer is answered as (None: the tokenizer is our own)."""
    size: int = 0
    done: asyncio.Future[Any] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


@dataclass(frozen=True)
class _Blame:
    """The model a job runs the tokenizer of, and the prompt's field."""

    model: str
    param: str

    def error(self, reason: str) -> ModelTemplateError:
        return ModelTemplateError(self.model, self.param, reason)


class _Died(PromptWorkerError):
    """The process ended during a job; ``signal`` is the one that ended it, if any."""

    def __init__(self, message: str, signum: int | None) -> None:
        super().__init__(message)
        self.signal = signum

    def fields(self) -> dict[str, object]:
        return {"message": str(self), "signum": self.signal}


class PromptProcesses:
    """``processes`` prompt processes; see the module docstring."""

    def __init__(
        self,
        processes: int = 1,
        *,
        job_timeout: float = JOB_TIMEOUT,
        max_waiting: int = MAX_WAITING,
        max_waiting_bytes: int = MAX_WAITING_BYTES,
        limits: TokenizerLimits | None = None,
    ) -> None:
        if processes < 1:
            raise InvalidInputError(f"prompt processes need at least 1 process, got {processes}")
        self._processes = processes
        self._timeout = job_timeout
        self.limits = limits if limits is not None else TokenizerLimits()
        self._queue = _Waiting(max_waiting, max_waiting_bytes)
        self._owners: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Self:
        self._owners = [
            asyncio.create_task(
                _Owner(self._queue, self._timeout, self.limits).run(), name=f"prompt process {i}"
            )
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
        for job in self._queue.drain():
            if not job.done.done():
                job.done.set_exception(PromptWorkerError("the daemon is stopping"))

    async def read_head(self, raw: bytes) -> Head:
        found: Head = await self._run(("head", raw), None)
        return found

    async def read_prompt(
        self, raw: bytes, api: OpenAIApi, tokenizer: Publishable, model: CardLimits
    ) -> ReadyRequest:
        job = ("prepare", raw, api.kind, tokenizer.checksum, model)
        param = "messages" if api.kind == "chat" else "prompt"
        found: ReadyRequest = await self._run(job, tokenizer, _blame(tokenizer, model.name, param))
        return found

    async def tokenize_text(
        self, text: str, tokenizer: Publishable, block_size: int, model: str = ""
    ) -> Tokenized:
        job = ("tokenize", text, tokenizer.checksum, block_size)
        found: Tokenized = await self._run(job, tokenizer, _blame(tokenizer, model, "prompt"))
        return found

    async def check_tokenizer(self, raw: bytes, checksum: str) -> None:
        """Build the bundle ``raw`` in a process, within the limits; raises
        ``TokenizerUnavailableError`` when it does not build (or ``PromptWorkerError``
        when no process can try now)."""
        try:
            await self._run(("tokenizer", checksum, raw), None)
        except _Died as exc:
            if exc.signal != signal.SIGXCPU:
                raise
            raise TokenizerUnavailableError(
                f"building the tokenizer ran past its CPU-time bound of "
                f"{self.limits.cpu_for(len(raw)):.3g} s"
            ) from None

    async def _run(
        self, message: tuple[Any, ...], tokenizer: Publishable | None, blame: _Blame | None = None
    ) -> Any:
        job = _Job(message, tokenizer, blame, _size(message))
        self._queue.put(job)
        return await job.done


def _size(message: tuple[Any, ...]) -> int:
    """The bytes a job holds while it waits: its body or text."""
    return sum(len(part) for part in message[1:] if isinstance(part, bytes | str))


class _Waiting:
    """The jobs waiting for a process, in order: at most ``jobs`` of them and ``size``
    bytes (one job always fits an empty queue)."""

    def __init__(self, jobs: int, size: int) -> None:
        self._queue: asyncio.Queue[_Job] = asyncio.Queue(jobs)
        self._size = size
        self._bytes = 0

    def put(self, job: _Job) -> None:
        full = self._queue.full() or (
            self._bytes + job.size > self._size and not self._queue.empty()
        )
        if full:
            raise PromptWorkerError(
                f"{self._queue.qsize()} requests ({self._bytes} bytes) are already waiting "
                "for the prompt processes; retry later"
            )
        self._queue.put_nowait(job)
        self._bytes += job.size

    async def get(self) -> _Job:
        job = await self._queue.get()
        self._bytes -= job.size
        return job

    def drain(self) -> list[_Job]:
        jobs = []
        while not self._queue.empty():
            jobs.append(self._queue.get_nowait())
        self._bytes = 0
        return jobs


def _blame(tokenizer: Publishable, model: str, param: str) -> _Blame | None:
    """Whom a job's tokenizer failures blame: the model, unless it is our own tokenizer."""
    return None if isinstance(tokenizer, SimpleTokenizer) else _Blame(model, param)


class _Owner:
    """One worker process and the task that feeds it."""

    def __init__(self, queue: _Waiting, timeout: float, limits: TokenizerLimits) -> None:
        self._queue = queue
        self._timeout = timeout
        self._limits = limits
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
            kind, value = "error", self._overrun(job, exc)
        if job.done.done():  # its caller went away: the answer is dropped
            return
        if kind == "ok":
            job.done.set_result(value)
        else:
            job.done.set_exception(value)

    def _overrun(self, job: _Job, exc: PromptWorkerError) -> Exception:
        """The job's error once its process failed: the model's, when the kernel ended
        the process for the CPU time of the model's tokenizer."""
        if job.blame is None or not isinstance(exc, _Died) or exc.signal != signal.SIGXCPU:
            return exc
        return job.blame.error(
            f"its chat template or tokenizer ran past its CPU-time bound "
            f"(template_cpu_seconds: {self._limits.cpu_seconds:g} s, plus as much per MiB of "
            "prompt); the prompt process was ended and replaced"
        )

    async def _ask(self, job: _Job) -> tuple[str, Any]:
        """The job's answer; a tokenizer the process lacks is sent first."""
        answer = await self._exchange(job.message)
        if answer[0] == "need" and job.tokenizer is not None:
            raw = published(job.tokenizer)
            installed = await self._exchange(("tokenizer", job.tokenizer.checksum, raw))
            if installed[0] == "error":
                return ("error", _not_built(job, installed[1]))
            answer = await self._exchange(job.message)
        if answer[0] == "need":
            raise PromptWorkerError(f"the prompt process lacks tokenizer {answer[1]}")
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
                f"preparing the request took the prompt process longer than {self._timeout:g} s"
            ) from None
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            code = await _exit_code(proc)
            raise _Died(
                f"the prompt process (pid {proc.pid}) exited ({_exit_text(code)}) while "
                f"preparing the request: {type(exc).__name__}",
                -code if code is not None and code < 0 else None,
            ) from None
        return answer

    async def _started(self) -> asyncio.subprocess.Process:
        if self._proc is None or self._proc.returncode is not None:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "dynamod.prompts.child",
                limits_arg(self._limits),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=2**16,
                env={**os.environ, **CHILD_ENV},
            )
            log.info("prompt process started: pid %d", self._proc.pid)
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


def _not_built(job: _Job, error: Exception) -> Exception:
    """The job's error when its tokenizer does not build in the process."""
    if job.blame is None:
        return PromptWorkerError(f"the prompt process cannot build the tokenizer: {error}")
    return job.blame.error(f"its tokenizer does not build in a prompt process: {error}")


async def _exit_code(proc: asyncio.subprocess.Process) -> int | None:
    """The process's exit code (negative: the signal that ended it); None while it runs."""
    try:
        async with asyncio.timeout(1.0):
            return await proc.wait()
    except TimeoutError:
        return None


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"ended by {signal.Signals(-code).name}"
        except ValueError:
            return f"ended by signal {-code}"
    return f"exit code {code}"
