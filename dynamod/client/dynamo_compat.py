"""Dynamo-style helpers: NVIDIA Dynamo's taint calls, one worker at a time, on top of the
operator API.

Dynamo's own Python API updates one worker's taints (``update_model_taints``: replace, as
its ``POST /engine/update/model_taints`` does) and returns the worker's complete set.
Scripts written for it keep working with these names: ``workers``, ``worker``,
``update_model_taints``, ``add_taints``, ``remove_taints``, ``clear_taints`` and
``events``. Each takes a worker as its id, a unique id prefix, its store key or a
``WorkerInfo``, and returns the complete taint set after the change. They are thin: each
is one call of the operator API (``list_workers``, ``get_worker``, ``update_taints`` with
a ``Target``, ``tail_events``), which is the client's one vocabulary.

``AsyncDynamoHelpers`` is mixed into ``AsyncClient``; ``DynamoHelpers`` into the blocking
``Client``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Coroutine, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from dynamod.reports import EventInfo
from dynamod.results import UpdateOutcome, WorkerInfo
from dynamod.taints import TaintUpdate

if TYPE_CHECKING:
    from dynamod.targets import Target

T = TypeVar("T")

Worker = str | WorkerInfo
"""A worker as the helpers take it: its id, a unique id prefix, its store key, or a
``WorkerInfo`` from ``workers()``."""


class OperatorApi(Protocol):
    """What the helpers need of an ``AsyncClient``."""

    async def list_workers(
        self, *, model: str = "", selector: str = ""
    ) -> tuple[list[WorkerInfo], int]: ...

    async def get_worker(self, ref: str) -> WorkerInfo: ...

    async def update_taints(
        self, update: TaintUpdate, target: Target, *, dry_run: bool = False
    ) -> list[UpdateOutcome]: ...

    def tail_events(
        self, *, since: int | None = None, selector: str = "", follow: bool = True
    ) -> AsyncGenerator[EventInfo, None]: ...


class AsyncDynamoHelpers:
    """The helpers for asyncio code; see the module docstring."""

    async def workers(
        self: OperatorApi, selector: str | None = None, *, model: str | None = None
    ) -> list[WorkerInfo]:
        """The workers the daemon knows, those ``selector`` matches (the ``-l`` language),
        of ``model`` when given. Each has ``.id``, ``.model`` and ``.taints`` (the complete
        set the router matches on), ``.caller_taints``, ``.generated_taints``, ``.record``."""
        found, _ = await self.list_workers(model=model or "", selector=selector or "")
        return found

    async def worker(self: OperatorApi, worker: Worker) -> WorkerInfo:
        """One worker, by id, unique id prefix or store key."""
        return await self.get_worker(_ref(worker))

    async def update_model_taints(
        self: OperatorApi, worker: Worker, taints: Iterable[str]
    ) -> tuple[str, ...]:
        """Dynamo's ``update_model_taints``: the worker's caller-managed taints become
        exactly ``taints`` (an empty collection clears them; the generated
        ``dynamo.topology/`` taints stay). Returns the worker's complete taint set after."""
        return await _one(self, worker, TaintUpdate.replace(taints))

    async def add_taints(
        self: OperatorApi, worker: Worker, taints: Iterable[str]
    ) -> tuple[str, ...]:
        """Add ``taints``; those already held stay. Returns the complete set after."""
        return await _one(self, worker, TaintUpdate.add(taints))

    async def remove_taints(
        self: OperatorApi, worker: Worker, taints: Iterable[str], *, keys: Iterable[str] = ()
    ) -> tuple[str, ...]:
        """Remove exactly ``taints``, and every taint whose key (before ``=``) is in
        ``keys``. Returns the complete set after."""
        return await _one(self, worker, TaintUpdate.remove(taints, keys))

    async def clear_taints(self: OperatorApi, worker: Worker) -> tuple[str, ...]:
        """Remove every caller-managed taint. Returns the complete set after (the
        generated ones)."""
        return await _one(self, worker, TaintUpdate.clear())

    async def events(
        self: OperatorApi, since: int | None = None, *, selector: str | None = None
    ) -> AsyncGenerator[EventInfo, None]:
        """Discovery events as they happen, until the daemon ends the stream. Without
        ``since`` a ``RESYNC`` snapshot of the workers comes first; with ``since`` (a
        revision) the events after it are replayed first, or a ``RESYNC`` when the daemon no
        longer remembers that far back. Leave the ``async for`` to stop."""
        async for event in self.tail_events(since=since, selector=selector or ""):
            yield event


async def _one(client: OperatorApi, worker: Worker, update: TaintUpdate) -> tuple[str, ...]:
    from dynamod.targets import Target  # a listing's client never builds one

    (outcome,) = await client.update_taints(update, Target(worker=_ref(worker)))
    return outcome.after


def _ref(worker: Worker) -> str:
    return worker.id if isinstance(worker, WorkerInfo) else worker


class Blocking(Protocol):
    """What the blocking helpers need of a ``Client``."""

    @property
    def aio(self) -> OperatorApi: ...

    def _run(self, coro: Coroutine[Any, Any, T]) -> T: ...

    def _iterate(self, stream: AsyncGenerator[EventInfo, None]) -> Iterator[EventInfo]: ...


class DynamoHelpers:
    """The helpers for blocking code, as ``AsyncDynamoHelpers``'s (each runs the async
    helper on the client's ``aio``)."""

    def workers(
        self: Blocking, selector: str | None = None, *, model: str | None = None
    ) -> list[WorkerInfo]:
        return self._run(AsyncDynamoHelpers.workers(self.aio, selector, model=model))

    def worker(self: Blocking, worker: Worker) -> WorkerInfo:
        return self._run(AsyncDynamoHelpers.worker(self.aio, worker))

    def update_model_taints(
        self: Blocking, worker: Worker, taints: Iterable[str]
    ) -> tuple[str, ...]:
        return self._run(AsyncDynamoHelpers.update_model_taints(self.aio, worker, taints))

    def add_taints(self: Blocking, worker: Worker, taints: Iterable[str]) -> tuple[str, ...]:
        return self._run(AsyncDynamoHelpers.add_taints(self.aio, worker, taints))

    def remove_taints(
        self: Blocking, worker: Worker, taints: Iterable[str], *, keys: Iterable[str] = ()
    ) -> tuple[str, ...]:
        return self._run(AsyncDynamoHelpers.remove_taints(self.aio, worker, taints, keys=keys))

    def clear_taints(self: Blocking, worker: Worker) -> tuple[str, ...]:
        return self._run(AsyncDynamoHelpers.clear_taints(self.aio, worker))

    def events(
        self: Blocking, since: int | None = None, *, selector: str | None = None
    ) -> Iterator[EventInfo]:
        """Discovery events as they happen (see ``AsyncDynamoHelpers.events``); leave the
        ``for`` loop (or close the iterator) to stop."""
        return self._iterate(AsyncDynamoHelpers.events(self.aio, since, selector=selector))
