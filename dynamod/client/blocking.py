"""``Client``: the blocking face of ``AsyncClient``, for scripts and notebooks.

It owns one event loop in one thread of its own, where an ``AsyncClient`` does the work;
each method hands its call to that loop and waits for the answer (an error raised there is
raised here). So it works from any thread, and inside a program that already runs an
event loop (a notebook), where ``asyncio.run`` would refuse. ``close()`` (or leaving the
``with`` block) closes the connection and ends the thread; a client nobody closed is closed
at interpreter exit (``dynamod.client.drain``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
import weakref
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
)
from concurrent.futures import Future
from typing import Any, TypeVar

from dynamod.client import drain
from dynamod.client.async_client import AsyncClient
from dynamod.client.dynamo_compat import DynamoHelpers
from dynamod.client.endpoint import Connection, Credentials, completed
from dynamod.pool_results import ApplyOutcome, PolicyInfo, PoolStatusInfo, RemoveOutcome
from dynamod.reports import DrainEvent, DrainResult, EventInfo, ExplainInfo, StatusInfo
from dynamod.results import UpdateOutcome
from dynamod.stats_results import FleetStats, StatsQuery
from dynamod.taints import TaintUpdate
from dynamod.targets import Target

T = TypeVar("T")
RELEASE_SECONDS = 5.0
"""How long closing a stream the caller left may take (its call is cancelled by then)."""


class Client(DynamoHelpers):
    """Blocking client; use ``with Client() as client``. Arguments as ``AsyncClient``'s:
    what is not given comes from the environment and dynamoctl's config file."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        credentials: Credentials | None = None,
        timeout: float | None = None,
    ) -> None:
        dial = completed(endpoint, credentials, timeout)
        self.endpoint = dial.endpoint
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=_serve, args=(self._loop,), name=f"dynamod-client {dial.endpoint}", daemon=True
        )
        self._thread.start()
        # A client dropped without close() still ends its thread when collected (close()
        # detaches this: its loop is closed by then, and may not be called).
        self._dropped = weakref.finalize(self, self._loop.call_soon_threadsafe, self._loop.stop)
        self._dropped.atexit = False
        self._async = self._run(_open(dial))
        drain.forget(self._async)  # drained as part of this client, never on its own
        drain.track(self)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the connection and end the client's thread. Idempotent."""
        if not self._closed:
            self._shut(deadline=None)

    def drain_at_exit(self, deadline: float) -> list[str]:
        if not self._closed:
            self._shut(deadline)
        return [f"thread {self._thread.name!r}"] if self._thread.is_alive() else []

    def _shut(self, deadline: float | None) -> None:
        self._closed = True
        self._dropped.detach()
        drain.forget(self)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        closing = asyncio.run_coroutine_threadsafe(self._async.close(), self._loop)
        try:
            closing.result(timeout=left)
        except TimeoutError:
            closing.cancel()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._thread.join(timeout=left)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise RuntimeError(f"the client of {self.endpoint} is closed")
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a Client cannot be called from its own event-loop thread")
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except BaseException:  # an interrupt while waiting: stop the call as well
            future.cancel()
            raise

    @property
    def aio(self) -> AsyncClient:
        """The ``AsyncClient`` this client runs on its own loop."""
        return self._async

    def update_taints(
        self, update: TaintUpdate, target: Target, *, dry_run: bool = False
    ) -> list[UpdateOutcome]:
        return self._run(self._async.update_taints(update, target, dry_run=dry_run))

    def drain(
        self,
        target: Target,
        *,
        timeout: float | None = None,
        progress: Callable[[DrainEvent], None] | None = None,
    ) -> DrainResult:
        """``AsyncClient.drain``: cordon for a drain, wait until nothing is in flight.
        ``progress`` runs on the client's own thread."""
        return self._run(self._async.drain(target, timeout=timeout, progress=progress))

    def explain(
        self,
        model: str,
        *,
        required: Iterable[str] = (),
        preferred: Mapping[str, float] | None = None,
        prompt: str = "",
    ) -> ExplainInfo:
        return self._run(
            self._async.explain(model, required=required, preferred=preferred, prompt=prompt)
        )

    def status(self) -> StatusInfo:
        return self._run(self._async.status())

    def tail_events(
        self,
        *,
        since: int | None = None,
        selector: str = "",
        follow: bool = True,
        pools: bool = False,
    ) -> Iterator[EventInfo]:
        """``AsyncClient.tail_events``, event by event; leaving the loop ends the stream."""
        return self._iterate(
            self._async.tail_events(since=since, selector=selector, follow=follow, pools=pools)
        )

    def watch_stats(self, query: StatsQuery | None = None) -> Iterator[FleetStats]:
        """``AsyncClient.watch_stats``, frame by frame; leaving the loop ends the stream."""
        return self._iterate(self._async.watch_stats(query))

    # Pool policies: as ``AsyncClient``'s.

    def apply_policy(self, document: str, *, dry_run: bool = False) -> ApplyOutcome:
        return self._run(self._async.apply_policy(document, dry_run=dry_run))

    def list_policies(self) -> list[PolicyInfo]:
        return self._run(self._async.list_policies())

    def get_policy(self, name: str) -> PolicyInfo:
        return self._run(self._async.get_policy(name))

    def pool_status(self, name: str) -> PoolStatusInfo:
        return self._run(self._async.pool_status(name))

    def pause_policy(self, name: str) -> tuple[PolicyInfo, bool]:
        return self._run(self._async.pause_policy(name))

    def resume_policy(self, name: str) -> tuple[PolicyInfo, bool]:
        return self._run(self._async.resume_policy(name))

    def remove_policy(self, name: str) -> RemoveOutcome:
        return self._run(self._async.remove_policy(name))

    def _iterate(self, stream: AsyncGenerator[T, None]) -> Iterator[T]:
        """The events of ``stream``, each fetched on the client's loop; the stream is
        closed when the caller leaves the ``for`` loop (or closes the iterator)."""
        try:
            while True:
                try:
                    event = self._run(_next(stream))
                except StopAsyncIteration:
                    return
                yield event
        finally:
            self._release(stream)

    def _release(self, stream: AsyncGenerator[T, None]) -> None:
        """Close an events stream the caller left (or dropped). Not at interpreter
        shutdown: this client's thread may be frozen by then, and waiting for it would
        hang the exit (the drain has closed the client before, if it may)."""
        if self._closed or sys.is_finalizing() or not self._thread.is_alive():
            return
        closing = asyncio.run_coroutine_threadsafe(_close(stream), self._loop)
        with contextlib.suppress(TimeoutError):
            closing.result(timeout=RELEASE_SECONDS)


async def _open(dial: Connection) -> AsyncClient:
    """The ``AsyncClient``, made on the client's own loop (its channel belongs there)."""
    return AsyncClient(dial.endpoint, credentials=dial.credentials, timeout=dial.timeout)


async def _next(stream: AsyncIterator[T]) -> T:
    return await anext(stream)


async def _close(stream: AsyncGenerator[T, None]) -> None:
    await stream.aclose()


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """The client's thread: run ``loop`` until stopped, then end what is left on it."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
