"""``AsyncClient``: the daemon's gRPC API for asyncio code; dynamoctl is built on it.

Endpoints: ``unix:///run/dynamod/dynamod.sock`` (or a bare path) for the local socket,
``host:port`` for TCP (with ``tls=True`` for TLS, ``ca`` / ``cert`` / ``key`` for mTLS).
What is not given comes from the environment and the config file dynamoctl reads
(``dynamod.client.endpoint``). Every call has a deadline. gRPC errors come back as our own
classes (``api/error_status.py``); an endpoint that does not answer raises ``UnreachableError``
naming it.

One vocabulary, the operator API dynamoctl uses: ``list_workers`` / ``stream_workers`` /
``get_worker``, ``update_taints`` / ``stream_update_taints`` (a ``TaintUpdate`` for a
``Target``: one worker, a selector, or all; dry runs), ``drain`` / ``wait_drained``,
``tail_events``, ``explain``, ``status``, ``watch_stats`` (the frames of ``dynamoctl
top``). NVIDIA Dynamo's one-worker helpers
(``update_model_taints``, ``add_taints``, ...) are a documented compatibility layer on top
of it (``dynamo_compat.py``).

A client that is never closed is closed at interpreter exit (``dynamod.client.drain``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import grpc
from grpc import aio

from dynamod.api import convert
from dynamod.api.v1 import dynamo_pb2 as pb
from dynamod.api.v1 import dynamo_pb2_grpc as rpc
from dynamod.client import drain
from dynamod.client.dynamo_compat import AsyncDynamoHelpers
from dynamod.client.endpoint import (
    UPDATE_WAIT,
    Credentials,
    call_error,
    completed,
    late,
    target_of,
)
from dynamod.errors import AnswerTimeoutError, DynamoError
from dynamod.records import ModelCard
from dynamod.reports import DrainEvent, DrainResult, DrainStatus, EventInfo, ExplainInfo, StatusInfo
from dynamod.results import ID_PREFIX, UpdateOutcome, WorkerInfo, WorkerPage
from dynamod.taints import DRAIN_TAINTS, TaintUpdate

if TYPE_CHECKING:  # pools', stats' and targets' types: imported by the calls that use them
    from dynamod.pool_results import ApplyOutcome, PolicyInfo, PoolStatusInfo, RemoveOutcome
    from dynamod.stats_results import FleetStats, StatsQuery
    from dynamod.targets import Target

# As large as the server allows: 10,000 workers listed are about 7 MB.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]


class AsyncClient(AsyncDynamoHelpers):
    """Async client; use ``async with AsyncClient() as client``.

    ``endpoint``, ``credentials`` and ``timeout`` default to what dynamoctl would use
    (``DYNAMO_ENDPOINT``, ``DYNAMO_TOKEN_FILE``, ..., the config file, the daemon's unix
    socket); pass ``Credentials()`` for none at all. Unreadable credential files raise
    ``ConfigError``."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        credentials: Credentials | None = None,
        timeout: float | None = None,
    ) -> None:
        dial = completed(endpoint, credentials, timeout)
        self.endpoint = dial.endpoint
        self.timeout = dial.timeout
        self._credentials = dial.credentials
        self._metadata = dial.credentials.metadata()  # what every call carries
        self._calls: set[Any] = set()
        self._closed = False
        self._loop = _running_loop()
        self._channel = self._open(target_of(dial.endpoint))
        drain.track(self)
        self._workers = rpc.WorkerServiceStub(self._channel)
        self._taints = rpc.TaintServiceStub(self._channel)
        self._events = rpc.EventServiceStub(self._channel)
        self._router = rpc.RouterServiceStub(self._channel)
        self._status = rpc.StatusServiceStub(self._channel)
        self._pools = rpc.PoolServiceStub(self._channel)
        self._stats = rpc.StatsServiceStub(self._channel)

    def _open(self, target: str) -> aio.Channel:
        creds = self._credentials
        if creds.tls or creds.ca or creds.cert:
            tls = grpc.ssl_channel_credentials(creds.ca, creds.key, creds.cert)
            return aio.secure_channel(target, tls, options=CHANNEL_OPTIONS)
        return aio.insecure_channel(target, options=CHANNEL_OPTIONS)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Cancel the calls still open and close the channel. Idempotent."""
        self._closed = True
        drain.forget(self)
        for call in list(self._calls):
            call.cancel()
        await self._channel.close(grace=None)

    @property
    def closed(self) -> bool:
        return self._closed

    def drain_at_exit(self, deadline: float) -> list[str]:
        """Close this forgotten client at interpreter exit, if its event loop can still run
        (it was not closed, and is not running); return what is still open then."""
        loop = self._loop
        if self._closed or loop is None or loop.is_running() or loop.is_closed():
            return self._still_open()
        left = max(0.0, deadline - time.monotonic())
        with contextlib.suppress(TimeoutError):
            loop.run_until_complete(asyncio.wait_for(self.close(), timeout=left))
        return self._still_open()

    def _still_open(self) -> list[str]:
        open_calls = [c for c in self._calls if not c.done()]
        if not open_calls:
            return []
        return [f"AsyncClient({self.endpoint}): {len(open_calls)} open call(s)"]

    async def _call(self, method: Any, request: Any, *, wait: float = 0.0) -> Any:
        """One unary call, its deadline ``timeout`` plus the daemon's own ``wait``."""
        self._loop = self._loop or asyncio.get_running_loop()
        deadline = self.timeout + wait
        try:
            return await method(request, timeout=deadline, metadata=self._metadata)
        except aio.AioRpcError as exc:
            raise self._error(exc, deadline) from None

    def _error(self, exc: aio.AioRpcError, deadline: float | None = None) -> DynamoError:
        return call_error(
            self.endpoint,
            exc.code().name,
            exc.details(),
            tuple(exc.trailing_metadata() or ()),
            within=self.timeout if deadline is None else deadline,
            connected=self._connected(),
        )

    def _connected(self) -> bool:
        """The channel is connected: a deadline then means a slow answer, not no daemon."""
        state = self._channel.get_state(try_to_connect=False)
        return bool(state == grpc.ChannelConnectivity.READY)

    def _late(self, deadline: float | None) -> AnswerTimeoutError:
        return late(self.endpoint, self.timeout if deadline is None else deadline)

    async def list_workers(
        self,
        *,
        model: str = "",
        selector: str = "",
        namespace: str = "",
        component: str = "",
        endpoint: str = "",
        fields: Iterable[str] = (),
    ) -> tuple[list[WorkerInfo], int]:
        """The workers that match (sorted by key) and the view's revision. ``fields``
        names the ``Worker`` message fields to carry (all when empty); with fewer, each
        record holds only those, the rest at their defaults (``convert.worker_from_pb``)."""
        request = convert.list_request(model, selector, namespace, component, endpoint, fields)
        reply = await self._call(self._workers.ListWorkers, request)
        return convert.workers_from_pb(reply.workers), reply.revision

    async def stream_workers(
        self,
        *,
        model: str = "",
        selector: str = "",
        namespace: str = "",
        component: str = "",
        endpoint: str = "",
        fields: Iterable[str] = (),
        page_size: int = 0,
    ) -> AsyncGenerator[WorkerPage, None]:
        """``list_workers`` in pages, by model then id, as the daemon sends them: the first
        arrives before the daemon has encoded the rest. Every page comes from one snapshot
        (the same revision and ``id_prefix``). The call's deadline covers the whole stream."""
        request = convert.list_request(model, selector, namespace, component, endpoint, fields)
        request.page_size = page_size
        call = self._workers.StreamWorkers(request, timeout=self.timeout, metadata=self._metadata)
        cards: dict[str, ModelCard] = {}
        async for reply in self._stream(call):
            workers = [convert.worker_from_pb(m, cards) for m in reply.workers]
            yield WorkerPage(workers, reply.revision, reply.id_prefix)

    async def id_prefix(self) -> int:
        """How many characters of an id tell apart every worker the daemon sees: what a
        table cuts ids to, so that each one printed resolves with ``get_worker``."""
        request = pb.ListWorkersRequest(fields=["id"], prefix_only=True)
        reply = await self._call(self._workers.ListWorkers, request)
        return max(int(reply.id_prefix), ID_PREFIX)

    async def get_worker(self, ref: str) -> WorkerInfo:
        reply = await self._call(self._workers.GetWorker, pb.GetWorkerRequest(id=ref))
        return convert.worker_from_pb(reply.worker)

    async def update_taints(
        self, update: TaintUpdate, target: Target, *, dry_run: bool = False
    ) -> list[UpdateOutcome]:
        """Apply ``update`` to the ``target``'s workers (one, those a selector matches, or
        all); with ``dry_run`` compute the outcomes and write nothing. Per-worker failures
        of a bulk update are in each outcome's ``error``."""
        request = convert.update_request(update, target, dry_run)
        reply = await self._call(self._taints.UpdateTaints, request, wait=UPDATE_WAIT)
        return [convert.change_from_pb(c) for c in reply.results]

    async def stream_update_taints(
        self, update: TaintUpdate, target: Target, *, dry_run: bool = False
    ) -> AsyncGenerator[UpdateOutcome, None]:
        """``update_taints``, each worker's outcome as soon as the daemon has it (in no set
        order): for progress on a bulk update."""
        request = convert.update_request(update, target, dry_run)
        call = self._taints.StreamUpdateTaints(request, metadata=self._metadata)
        async for message in self._stream(call, idle=self.timeout + UPDATE_WAIT):
            yield convert.change_from_pb(message)

    async def drain(
        self,
        target: Target,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the daemon's wait, which reports at its end
        progress: Callable[[DrainEvent], None] | None = None,
    ) -> DrainResult:
        """Drain the ``target``'s workers: cordon them for a drain (``dynamo.io/cordoned``
        and ``dynamo.io/draining``, one taint update per worker), then wait until nothing
        is in flight on them (``wait_drained``), at most ``timeout`` seconds (None: no
        limit). ``progress`` is called with each event of the wait. ``uncordon`` (removing
        both taints) ends a drain. A bulk cordon's failures are in ``cordoned``, and the
        result is then not ``drained``."""
        cordoned = await self.update_taints(TaintUpdate.add(DRAIN_TAINTS), target)
        return await self.follow_drain(cordoned, target, timeout=timeout, progress=progress)

    async def follow_drain(
        self,
        cordoned: Iterable[UpdateOutcome],
        target: Target,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the daemon's wait, which reports at its end
        progress: Callable[[DrainEvent], None] | None = None,
    ) -> DrainResult:
        """The wait of ``drain``, after its cordon (whose outcomes are ``cordoned``)."""
        outcomes = list(cordoned)
        after = max((c.revision for c in outcomes if c.error is None), default=0)
        seen: dict[str, DrainStatus] = {}
        last = None
        async for event in self.wait_drained(target, timeout=timeout, after_revision=after):
            seen.update((w.key, w) for w in event.workers)
            if progress is not None:
                progress(event)
            last = event if event.last else None
        return DrainResult.of(outcomes, seen, last)

    async def wait_drained(
        self,
        target: Target,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the daemon's wait, which reports at its end
        after_revision: int = 0,
    ) -> AsyncGenerator[DrainEvent, None]:
        """The wait for the ``target``'s workers to drain, as the daemon sends it: every
        worker's in-flight figures first, then each change; the ``last`` event says how it
        ended (drained, timed out after ``timeout`` seconds, or some drain ended by an
        uncordon). ``after_revision``: the drain's update, which the daemon's view must
        hold before it picks the workers."""
        request = convert.wait_drained_to_pb(target, timeout, after_revision)
        deadline = None if timeout is None else timeout + self.timeout
        call = self._workers.WaitDrained(request, timeout=deadline, metadata=self._metadata)
        async for message in self._stream(call):
            yield convert.drain_event_from_pb(message)

    async def tail_events(
        self,
        *,
        since: int | None = None,
        selector: str = "",
        follow: bool = True,
        pools: bool = False,
    ) -> AsyncGenerator[EventInfo, None]:
        """Discovery events; ends when the daemon ends the stream (or at once with
        ``follow=False`` after what is known). With ``pools``, the pool events too (kind
        ``POOL``, ``EventInfo.pool``)."""
        request = pb.TailEventsRequest(selector=selector, no_follow=not follow, pools=pools)
        if since is not None:
            request.since = since
        call = self._events.TailEvents(request, metadata=self._metadata)
        async for message in self._stream(call):
            yield convert.event_from_pb(message)

    async def watch_stats(
        self, query: StatsQuery | None = None
    ) -> AsyncGenerator[FleetStats, None]:
        """The fleet's frames as the daemon samples them (``dynamod.stats_results``): one
        at once (its ``interval`` 0 when nothing was sampled yet: no rates), then one a
        second, each with workers by state, answers per second and first-byte quantiles
        through this daemon, its router's queue, each pool's counts and leader, and the
        rows of ``query`` (a selector, an order, ``limit`` rows from ``offset``: the daemon
        sorts and cuts, so a frame of a large fleet stays small). Ends when the daemon
        drains; no deadline (it is a watch)."""
        from dynamod.api import stats_convert
        from dynamod.stats_results import StatsQuery

        request = stats_convert.query_to_pb(query or StatsQuery())
        call = self._stats.WatchStats(request, metadata=self._metadata)
        async for message in self._stream(call):
            yield stats_convert.stats_from_pb(message)

    async def _stream(self, call: Any, idle: float | None = None) -> AsyncGenerator[Any, None]:
        """The messages of a server stream, its errors as ours; cancelled when left.
        ``idle``: the longest wait for each message (then ``AnswerTimeoutError``)."""
        self._loop = self._loop or asyncio.get_running_loop()
        self._calls.add(call)
        messages = aiter(call)
        try:
            while True:
                try:
                    async with asyncio.timeout(idle):
                        message = await anext(messages)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    raise self._late(idle) from None
                yield message
        except aio.AioRpcError as exc:
            raise self._error(exc) from None
        finally:
            call.cancel()
            self._calls.discard(call)

    async def explain(
        self,
        model: str,
        *,
        required: Iterable[str] = (),
        preferred: Mapping[str, float] | None = None,
        prompt: str = "",
    ) -> ExplainInfo:
        request = pb.ExplainRequest(
            model=model,
            required_taints=list(required),
            preferred_taints=dict(preferred or {}),
            prompt=prompt,
        )
        return convert.explain_from_pb(await self._call(self._router.Explain, request))

    async def status(self) -> StatusInfo:
        return convert.status_from_pb(await self._call(self._status.GetStatus, pb.StatusRequest()))

    # Pool policies (dynamod/pools): the PoolService.

    # The pools' calls import their converter (and the pools' types) when first made: a
    # listing or a taint update, what scripts run in loops, never pays for them.
    async def apply_policy(self, document: str, *, dry_run: bool = False) -> ApplyOutcome:
        """Store a pool policy (YAML or JSON text); a refused one raises ``PoolPolicyError``
        naming the field and the rule, and stores nothing. With ``dry_run`` check and plan
        only. The outcome says ``created``, ``changed`` or ``unchanged`` and the moves the
        daemon plans for it."""
        request = pb.ApplyPolicyRequest(document=document, dry_run=dry_run)
        from dynamod.api import pool_convert

        return pool_convert.apply_from_pb(await self._call(self._pools.ApplyPolicy, request))

    async def list_policies(self) -> list[PolicyInfo]:
        reply = await self._call(self._pools.ListPolicies, pb.ListPoliciesRequest())
        from dynamod.api import pool_convert

        return [pool_convert.policy_from_pb(p) for p in reply.policies]

    async def get_policy(self, name: str) -> PolicyInfo:
        """The stored policy ``name``; ``PolicyNotFoundError`` when there is none."""
        reply = await self._call(self._pools.GetPolicy, pb.PolicyRequest(name=name))
        from dynamod.api import pool_convert

        return pool_convert.policy_from_pb(reply.policy)

    async def pool_status(self, name: str) -> PoolStatusInfo:
        """Target and actual counts per pool, pending and recent moves, drift, the leader."""
        reply = await self._call(self._pools.GetPoolStatus, pb.PolicyRequest(name=name))
        from dynamod.api import pool_convert

        return pool_convert.status_from_pb(reply)

    async def pause_policy(self, name: str) -> tuple[PolicyInfo, bool]:
        """Pause ``name`` (planned and reported, nothing written); whether this changed it."""
        reply = await self._call(self._pools.PausePolicy, pb.PolicyRequest(name=name))
        from dynamod.api import pool_convert

        return pool_convert.policy_from_pb(reply.policy), reply.changed

    async def resume_policy(self, name: str) -> tuple[PolicyInfo, bool]:
        reply = await self._call(self._pools.ResumePolicy, pb.PolicyRequest(name=name))
        from dynamod.api import pool_convert

        return pool_convert.policy_from_pb(reply.policy), reply.changed

    async def remove_policy(self, name: str) -> RemoveOutcome:
        """Delete ``name``; every worker keeps its taints as they are."""
        reply = await self._call(self._pools.RemovePolicy, pb.PolicyRequest(name=name))
        from dynamod.api import pool_convert

        return pool_convert.remove_from_pb(reply)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # made outside a coroutine: the first call will say which loop
        return None
