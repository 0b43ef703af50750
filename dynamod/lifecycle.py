"""Process lifecycle shared by dynamod, dynamo-worker and dynamoctl: signals, and the
bounded drain before the interpreter exits.

``run(main)`` runs one coroutine on a fresh event loop and returns its exit code. After
``main`` returns, whatever tasks and non-daemon threads remain get **one bounded wait**
(``exit_drain_seconds()``: 250 ms by default, Dynamo's bound; ``DYNAMO_DRAIN``
seconds to change it, ``0`` for no wait). If some are still alive at the deadline, their
names are logged at info level and the process ends at once with ``os._exit``, without
touching them: cancelling or joining them could hang, and letting the interpreter finalize
around live tasks is what prints "Task was destroyed but it is pending" or "Exception
ignored". Nothing in this path creates a loop, a thread or a connection. The Python client
drains its own forgotten connections at exit with the same bound
(``dynamod.client.drain``).

The servers (``dynamod``, ``dynamo-worker``, the demo) run on uvloop where it is installed
(``run(..., server=True)``; ``bench.front`` measures both loops side by side), unless
``DYNAMO_EVENT_LOOP=asyncio`` asks for the standard library's loop; ``dynamoctl`` keeps
the standard loop, which costs it no import.

``Signals`` turns SIGTERM / SIGINT into events: the first sets ``stopping`` (drain within
the grace period), the second sets ``forced`` (skip the grace period). SIGHUP calls the
reload callback when one is given.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dynamod.errors import DynamoError, ListenError

log = logging.getLogger(__name__)

EX_OK = 0
EX_FAILURE = 1
EX_UNAVAILABLE = 69  # a socket or port to serve on is taken (sysexits.h)
EX_SOFTWARE = 70  # the shutdown deadline ran out (sysexits.h)
DRAIN_SECONDS = 0.25
DRAIN_ENV = "DYNAMO_DRAIN"
LOOP_ENV = "DYNAMO_EVENT_LOOP"
LOOPS = ("uvloop", "asyncio")


def exit_drain_seconds() -> float:
    """The bound of the drain at exit: ``$DYNAMO_DRAIN`` seconds (``0``: none), else
    ``DRAIN_SECONDS``. A value that is not a number ≥ 0 is logged and the default used, as
    Dynamo does with its shutdown timeout."""
    raw = os.environ.get(DRAIN_ENV)
    if raw is None or not raw.strip():
        return DRAIN_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0.0 <= seconds < float("inf"):
        log.warning(
            "%s=%r is not a number of seconds >= 0; using %g", DRAIN_ENV, raw, DRAIN_SECONDS
        )
        return DRAIN_SECONDS
    return seconds


class Signals:
    """SIGTERM / SIGINT as two events, SIGHUP as a callback; see the module docstring."""

    def __init__(self, *, reload: Callable[[], None] | None = None) -> None:
        self.stopping = asyncio.Event()
        self.forced = asyncio.Event()
        self.received: list[str] = []
        self._reload = reload
        self._loop = asyncio.get_running_loop()

    def install(self) -> Signals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self._stop, sig)
        if self._reload is not None:
            self._loop.add_signal_handler(signal.SIGHUP, self._reload)
        return self

    def _stop(self, sig: signal.Signals) -> None:
        self.received.append(sig.name)
        if self.stopping.is_set():
            log.warning("%s again: skipping the grace period", sig.name)
            self.forced.set()
        else:
            log.info("%s received: shutting down gracefully", sig.name)
            self.stopping.set()


async def guarded(main: Coroutine[Any, Any, int], program: str) -> int:
    """Run ``main``; a ``DynamoError`` or ``OSError`` (a store that cannot be reached)
    ends it with one line on stderr and exit code 1 instead of a traceback; a socket or
    port already taken (``ListenError``) with 69."""
    try:
        return await main
    except (DynamoError, OSError) as exc:
        log.error("%s: %s", program, exc)
        return EX_UNAVAILABLE if isinstance(exc, ListenError) else EX_FAILURE


async def _outlived(deadline: float) -> list[str]:
    """Wait until ``deadline`` for other tasks and threads to end; return those alive."""
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    if tasks:
        await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
    alive = [f"task {t.get_name()!r} ({t.get_coro()!r})" for t in tasks if not t.done()]
    return alive + _threads_alive(deadline)


def _threads_alive(deadline: float) -> list[str]:
    others = [
        t
        for t in threading.enumerate()
        if t is not threading.current_thread() and not t.daemon and t.is_alive()
    ]
    for thread in others:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    return [f"thread {t.name!r}" for t in others if t.is_alive()]


def server_loop() -> asyncio.AbstractEventLoop:
    """A new loop for a server: uvloop's where it is installed, unless ``$DYNAMO_EVENT_LOOP``
    is ``asyncio``. Another value is logged and the default used (as ``DYNAMO_DRAIN``)."""
    chosen = os.environ.get(LOOP_ENV, "").strip() or LOOPS[0]
    if chosen not in LOOPS:
        log.warning("%s=%r is not one of %s; using %s", LOOP_ENV, chosen, "/".join(LOOPS), LOOPS[0])
        chosen = LOOPS[0]
    if chosen == "uvloop":
        try:
            import uvloop
        except ImportError:
            log.debug("uvloop is not installed: the standard event loop serves")
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(
    main: Callable[[], Coroutine[Any, Any, int]],
    *,
    drain: float | None = None,
    server: bool = False,
) -> int:
    """Run ``main()`` and return its exit code, after the drain bounded by ``drain``
    seconds (default: ``exit_drain_seconds()``); ``server``: on ``server_loop()``."""
    drain = exit_drain_seconds() if drain is None else drain
    loop = server_loop() if server else asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    # Our own executor, so the drain can stop it without the extra thread that
    # loop.shutdown_default_executor() would start.
    executor = ThreadPoolExecutor(thread_name_prefix="dynamo-io")
    loop.set_default_executor(executor)

    async def supervise() -> tuple[int, list[str]]:
        code = await main()
        executor.shutdown(wait=False, cancel_futures=True)
        return code, await _outlived(time.monotonic() + drain)

    code, alive = loop.run_until_complete(supervise())
    if alive:
        for name in alive:
            log.info("still alive at exit, left as is: %s", name)
        _hard_exit(code)
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()
    asyncio.set_event_loop(None)
    return code


def _hard_exit(code: int) -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
