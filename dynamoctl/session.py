"""Running one command: its event loop, its signals, and the one error boundary.

``execute(ctx, body)`` (a typer command) and ``run_body(options, body)`` (the typer-free
commands of ``direct.py``) run ``body(client, printer)`` under ``dynamod.lifecycle.run`` (the
bounded drain, so no task or thread outlives the loop) and turn whatever happens into an
exit status (``dynamoctl.exits``). ``run_light(options, body)`` runs a ``LightBody`` on
``dynamod.client.light``'s client, which needs neither gRPC nor an event loop (the body's
awaits never suspend), to the same statuses, lines and signals; where that client is not
sure, it runs ``run_body`` instead:

* the body's own status; a ``DynamoError`` → one line on stderr and 1, ``UnreachableError``
  → 3, ``ConfigError`` (bad credentials files) → 2; anything unexpected → one line and 1.
  ``--debug`` adds the traceback.
* SIGINT / SIGTERM cancel the body: a stream (``events tail``, ``--watch``) then ends with
  0, any other command with 130. Nothing is printed either way.
* stdout closed by its reader (``| head``), noticed at the next write or, on Linux, at
  once: the body is cancelled, stdout is pointed at /dev/null so the final flush cannot
  fail again, and the status is 141, as if killed by SIGPIPE.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import stat
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from dynamoctl import exits
from dynamoctl.invocation import OUTPUTS, Options
from dynamoctl.output import Printer
from dynamod.errors import ConfigError, DynamoError, UnreachableError

if TYPE_CHECKING:  # asyncio, the lifecycle and the tasks: imported when a loop runs
    import asyncio
    from collections.abc import Coroutine
    from typing import Any

    import typer

    from dynamod.client import AsyncClient
    from dynamod.client.light import LightClient

Body = Callable[["AsyncClient", Printer], Awaitable[int]]
LightBody = Callable[["AsyncClient | LightClient", Printer], Awaitable[int]]
"""A body that makes only the calls ``LightClient`` has (it is a ``Body`` too)."""


def execute(
    ctx: typer.Context,
    body: Body,
    *,
    formats: Sequence[str] = OUTPUTS,
    stream: bool = False,
) -> None:
    """Run ``body`` against the daemon and exit with its status (see the module docstring).
    ``formats``: the ``-o`` values this command supports; another one is a usage error."""
    import typer

    from dynamoctl.options import UsageError, from_context

    options = from_context(ctx)
    shaped = options.output.partition("=")[0] in ("jsonpath", "custom-columns")
    if options.output not in formats and not (shaped and "json" in formats):
        raise UsageError(
            f"{options.output!r} is not supported by '{ctx.command_path}'; use {', '.join(formats)}"
        )
    code = run_body(options, body, stream=stream)
    if code != exits.OK:
        raise typer.Exit(code)


def run_body(options: Options, body: Body, *, stream: bool = False) -> int:
    """``execute`` without typer, for options already checked: the exit status."""
    return _run(options, lambda printer: _with_client(options, printer, body), stream)


def run_light(options: Options, body: LightBody) -> int:
    """``run_body`` on the light client (``dynamoctl.client.connect_light``), without an
    event loop; ``run_body`` itself where that client is not sure (``LightClient.open``).
    SIGINT / SIGTERM end it with 130 and nothing printed, as ``supervise`` does."""
    from dynamoctl.client import connect_light

    printer = Printer(options.output, no_headers=options.no_headers)
    configure_logging(options.debug)
    # Both taken here, as run_body's loop takes both: a process started with SIGINT
    # ignored (a background job of a script) gets no KeyboardInterrupt from Python itself.
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            client = connect_light(options)
            opened = client.open()
        except ConfigError:  # the credential files: reported as run_body reports them
            opened = False
        except UnreachableError as exc:  # no connection within the timeout
            code = report(printer, options, exc)
            printer.flush()
            return code
        if not opened:
            for sig, handler in previous.items():  # run_body's loop takes both signals
                signal.signal(sig, handler)
            return run_body(options, body)

        async def work() -> int:
            async with client:
                return await body(client, printer)

        return _to_end(guarded(options, printer, work))
    except KeyboardInterrupt:  # SIGINT, or SIGTERM (_interrupt): cancelled, as supervise
        return exits.INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous[signal.SIGTERM])
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as run_body: only exiting is left


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _to_end(coroutine: Coroutine[Any, Any, int]) -> int:
    """Run a coroutine that never suspends (the light client's calls) to its end."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        result: int = done.value
        return result
    coroutine.close()
    raise RuntimeError("a light session body awaited something other than the light client")


def _run(options: Options, work: Callable[[Printer], Awaitable[int]], stream: bool) -> int:
    from dynamod.lifecycle import run

    printer = Printer(options.output, no_headers=options.no_headers)
    configure_logging(options.debug)
    on_signal = exits.OK if stream else exits.INTERRUPTED
    code = run(lambda: supervise(options, printer, lambda: work(printer), on_signal))
    # Only exiting is left; a Ctrl-C now must not turn into a KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return code


def configure_logging(debug: bool) -> None:
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("dynamoctl: %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, handlers=[handler])


async def supervise(
    options: Options, printer: Printer, body: Callable[[], Awaitable[int]], on_signal: int
) -> int:
    """Run the command (``body``: the client opened, the session body run) as a task; the
    first SIGINT / SIGTERM cancels it, and so does the reader of a piped stdout going
    away."""
    import asyncio

    from dynamod.tasks import wait_any

    loop = asyncio.get_running_loop()
    stop, gone, finished = asyncio.Event(), asyncio.Event(), asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    work = asyncio.create_task(guarded(options, printer, body), name="dynamoctl")
    work.add_done_callback(lambda _: finished.set())
    with reader_gone(loop, gone.set):
        await wait_any(finished, stop, gone)
    if not work.done():
        work.cancel()
        await asyncio.wait({work})
    if not work.cancelled():
        return work.result()
    if gone.is_set():
        silence_stdout()
        return exits.BROKEN_PIPE
    return on_signal


@contextlib.contextmanager
def reader_gone(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> Iterator[None]:
    """Call ``callback`` once if stdout is a pipe whose reader closes it, even while
    nothing is being written: ``dynamoctl events tail | head -1`` ends when head does, not
    at the next event. Linux reports that as EPOLLERR on the write end."""
    fd = _stdout_pipe()
    if fd is None or not hasattr(select, "epoll"):
        yield
        return
    poller = select.epoll()
    poller.register(fd, 0)  # mask 0: errors and hang-ups only, always reported

    def fired() -> None:
        loop.remove_reader(poller.fileno())  # level-triggered: fire once
        callback()

    loop.add_reader(poller.fileno(), fired)
    try:
        yield
    finally:
        loop.remove_reader(poller.fileno())
        poller.close()


def _stdout_pipe() -> int | None:
    """stdout's descriptor when it is a pipe, else None (a terminal, a file, no fd)."""
    try:
        fd = sys.stdout.fileno()
        return fd if stat.S_ISFIFO(os.fstat(fd).st_mode) else None
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        return None


async def _with_client(options: Options, printer: Printer, body: Body) -> int:
    from dynamoctl.client import connect

    async with connect(options) as client:
        return await body(client, printer)


async def guarded(options: Options, printer: Printer, body: Callable[[], Awaitable[int]]) -> int:
    """The error boundary: every outcome becomes an exit status and at most one line."""
    try:
        code = await body()
        printer.flush()
        return code
    except BrokenPipeError:
        silence_stdout()
        return exits.BROKEN_PIPE
    except DynamoError as exc:
        return report(printer, options, exc)
    except Exception as exc:  # noqa: BLE001 - the boundary: a bug still gets one line, no trace
        if options.debug:
            import traceback

            traceback.print_exc()
        printer.error(f"internal error: {type(exc).__name__}: {exc} (--debug shows where)")
        return exits.FAILED


def report(printer: Printer, options: Options, error: DynamoError) -> int:
    if options.debug:
        import traceback

        traceback.print_exception(error)
    printer.error(str(error))
    if isinstance(error, UnreachableError):
        return exits.UNREACHABLE
    if isinstance(error, ConfigError):
        return exits.USAGE
    return exits.FAILED


def silence_stdout() -> None:
    """After EPIPE: send what is still buffered to /dev/null (Python's documented recipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
