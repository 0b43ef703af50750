"""The gRPC servicers: identify the caller, convert, call ``Control``, convert back.

Every call is authenticated (``auth.Tokens.identify``), counted in the API metrics by
method and status code, and every ``DynamoError`` leaves as its status code (the error
tree in ``dynamod/errors.py``) with the domain message and the error class in trailing
metadata. Requests become our values here (``TaintUpdate``, ``Target``,
``RoutingConstraints``), whose constructors check them: that is the server side's one
check of each rule. Every server stream holds one of the ``StreamSlots`` while it is open
(``stream_slots.py``): a client that opens streams and never reads them is refused
``RESOURCE_EXHAUSTED`` past the limits instead of growing the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from typing import Any, TypeVar

import grpc
from grpc import aio
from prometheus_client import CollectorRegistry, Counter, Histogram

from dynamod.api import convert, pool_service, stats_service, worker_pages
from dynamod.api.context import Context
from dynamod.api.error_status import fit, status_of, trailers
from dynamod.api.stream_slots import StreamSlots
from dynamod.api.v1 import dynamo_pb2 as pb
from dynamod.api.v1 import dynamo_pb2_grpc as rpc
from dynamod.auth import Principal, Tokens
from dynamod.control import Control
from dynamod.daemon_metrics import DaemonMetrics
from dynamod.discovery.view import Subscription
from dynamod.discovery_events import (
    DiscoveryEvent,
    ViewResync,
    WorkerAdded,
    WorkerModified,
    WorkerRemoved,
)
from dynamod.drain_watch import DrainWatch
from dynamod.errors import (
    DynamoError,
    InvalidInputError,
    PermissionDeniedError,
    ShuttingDownError,
    StoreUnavailableError,
    StreamLimitError,
    UnauthenticatedError,
)
from dynamod.pools.operations import PoolOperations
from dynamod.reports import DrainEvent, EventInfo
from dynamod.results import UpdateOutcome, WorkerInfo
from dynamod.selectors import Selector, parse
from dynamod.stats_sampler import StatsSampler
from dynamod.taints import RoutingConstraints, TaintUpdate

log = logging.getLogger(__name__)

R = TypeVar("R")


LISTING_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ServiceContext:
    """Shared by the servicers: the control plane, the caller's identity, the metrics."""

    def __init__(
        self,
        control: Control,
        tokens: Tokens,
        registry: CollectorRegistry,
        slots: StreamSlots,
        metrics: DaemonMetrics | None = None,
        pools: PoolOperations | None = None,
        stats: StatsSampler | None = None,
    ) -> None:
        self.control = control
        self.pools = pools
        """The pool policies' operations (``PoolService``, pool events in ``TailEvents``)."""
        self.stats = stats
        """The fleet's frames (``StatsService``, ``stats_service.py``)."""
        self.metrics = metrics
        self.tokens = tokens
        self.slots = slots
        self.calls = Counter(
            "dynamod_api_calls", "API calls by method and status code.", ["method", "code"],
            registry=registry,
        )  # fmt: skip
        self.listing = Histogram(
            "dynamod_api_listing_seconds",
            "Time the daemon spends on a listing, by method: selecting the workers and "
            "writing the answer (ListWorkers), or its first page (StreamWorkers); sending "
            "it is not included.",
            ["method"],
            buckets=LISTING_BUCKETS,
            registry=registry,
        )
        self.tails: set[Subscription] = set()
        self.drain_watches: set[DrainWatch] = set()
        self.draining = False

    def identify(self, context: Context) -> Principal:
        """Who is calling (``auth.Tokens.identify``), with where from (``peer``)."""
        metadata = context.invocation_metadata() or ()
        presented = [str(value) for key, value in metadata if key == "authorization"]
        if len(presented) > 1:
            raise UnauthenticatedError(
                f"{len(presented)} authorization headers were sent; send exactly one bearer token"
            )
        scheme, _, token = (presented[0] if presented else "").partition(" ")
        names = list(context.auth_context().get("x509_common_name") or [])
        cert = names[0].decode() if names else None
        peer = context.peer()
        caller = self.tokens.identify(
            peer=peer, token=token.strip() if scheme.lower() == "bearer" else None,
            cert_name=cert,
        )  # fmt: skip
        return replace(caller, peer=peer)

    async def call(
        self,
        method: str,
        context: Context,
        body: Callable[[Principal], Awaitable[R]],
        *,
        asked: dict[str, object] | None = None,
    ) -> R:
        """Identify the caller and run ``body``; a ``DynamoError`` leaves as its status.
        ``asked``: what a mutation asks for; a caller refused at the door is audited."""
        try:
            caller = self.identify(context)
        except DynamoError as exc:
            if asked is not None:
                peer = context.peer()
                self.control.audit_refused(f"unauthenticated {peer}", asked, exc, peer=peer)
            await self.fail(method, context, exc)
        try:
            result = await body(caller)
        except DynamoError as exc:
            await self.fail(method, context, exc)
        self.calls.labels(method, "OK").inc()
        return result

    async def fail(self, method: str, context: Context, exc: DynamoError) -> Any:
        code = status_of(exc)
        self.calls.labels(method, code.name).inc()
        if self.metrics is not None and isinstance(exc, StoreUnavailableError):
            self.metrics.store_errors.labels(method).inc()
        context.set_trailing_metadata(trailers(exc))
        await context.abort(code, fit(str(exc)))

    def end_tails(self) -> None:
        """Draining: end every open event stream (and drain wait) so the server can stop."""
        self.draining = True
        for subscription in list(self.tails):
            subscription.close()
        for watch in list(self.drain_watches):
            watch.close()


PAGE_SIZE = 500
"""Workers per StreamWorkers message when the request does not say."""
MAX_PAGE_SIZE = 10_000


class WorkerService(rpc.WorkerServiceServicer):
    """Listings: the selection and the fields are applied here, in the daemon, and the
    answers are written from each worker's encoded form, kept between listings
    (``worker_pages.WorkerMessages``): ListWorkers and StreamWorkers return bytes, which
    ``add_services`` lets through to gRPC as they are."""

    def __init__(self, api: ServiceContext) -> None:
        self.api = api
        self.messages = worker_pages.WorkerMessages(api.control.view.get)

    async def ListWorkers(  # type: ignore[override]
        self, request: pb.ListWorkersRequest, context: Context
    ) -> bytes:
        async def body(_: Principal) -> bytes:
            with self.api.listing.labels("ListWorkers").time():
                fields = worker_pages.worker_fields(request.fields)
                prefix = self.api.control.id_prefix()
                workers: list[WorkerInfo] = []
                revision = self.api.control.view.revision
                if not request.prefix_only:  # the prefix is the whole fleet's, whatever the filter
                    workers, revision = self._select(request)
                return self.messages.response(workers, fields, revision, prefix)

        return await self.api.call("ListWorkers", context, body)

    async def StreamWorkers(  # type: ignore[override]
        self, request: pb.ListWorkersRequest, context: Context
    ) -> AsyncIterator[bytes]:
        started = time.perf_counter()
        with contextlib.ExitStack() as slot:
            try:
                caller = self.api.identify(context)
                fields = worker_pages.worker_fields(request.fields)
                size = _page_size(request.page_size)
                slot.enter_context(self.api.slots.hold(caller))
                workers, revision = self._select(request)
            except DynamoError as exc:
                await self.api.fail("StreamWorkers", context, exc)
            workers.sort(key=lambda w: (w.record.model, w.id, w.record.key))
            prefix = self.api.control.id_prefix()
            for start in range(0, max(len(workers), 1), size):
                page = self.messages.response(
                    workers[start : start + size], fields, revision, prefix
                )
                if start == 0:  # the first page is ready
                    self.api.listing.labels("StreamWorkers").observe(time.perf_counter() - started)
                yield page
        self.api.calls.labels("StreamWorkers", "OK").inc()

    def _select(self, request: pb.ListWorkersRequest) -> tuple[list[WorkerInfo], int]:
        return self.api.control.list_workers(
            model=request.model, selector=request.selector, namespace=request.namespace,
            component=request.component, endpoint=request.endpoint,
        )  # fmt: skip

    async def GetWorker(self, request: pb.GetWorkerRequest, context: Context) -> Any:
        async def body(_: Principal) -> pb.GetWorkerResponse:
            worker = self.api.control.get_worker(request.id)
            return pb.GetWorkerResponse(worker=convert.worker_to_pb(worker))

        return await self.api.call("GetWorker", context, body)

    # Written with context.write() from the wait itself (as StreamUpdateTaints is).
    async def WaitDrained(  # type: ignore[override]
        self, request: pb.WaitDrainedRequest, context: Context
    ) -> None:
        async def sent(event: DrainEvent) -> None:
            await context.write(convert.drain_event_to_pb(event))

        async def body(caller: Principal) -> None:
            if self.api.draining:
                raise ShuttingDownError("dynamod is shutting down; retry on another replica")
            if caller.role != "write":  # the wait is the second half of a drain, a write
                raise PermissionDeniedError(
                    f"{caller.name!r} has read-only access; waiting for a drain needs a "
                    "write token (workers ls shows each worker's state to any token)"
                )
            target = convert.target_from_pb(request)
            deadline = _drain_deadline(request.timeout_seconds)
            with (
                self.api.slots.hold(caller),  # a stream slot, as TailEvents takes
                self.api.control.watch_drain(
                    target, after_revision=request.after_revision
                ) as watch,
            ):
                self.api.drain_watches.add(watch)
                # The headers now, before any status: the caller knows the wait holds a
                # slot (a refusal arrives as the call's end) even while nothing is drained.
                await context.send_initial_metadata(())
                try:
                    await watch.run(sent, deadline)
                finally:
                    self.api.drain_watches.discard(watch)

        await self.api.call("WaitDrained", context, body)


def _drain_deadline(seconds: float) -> float | None:
    """The loop time a drain wait of ``seconds`` ends at; None for 0 (no timeout)."""
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidInputError(
            f"timeout_seconds {seconds} is not a number of seconds >= 0 (0: no timeout)"
        )
    return asyncio.get_running_loop().time() + seconds if seconds else None


class TaintService(rpc.TaintServiceServicer):
    def __init__(self, api: ServiceContext) -> None:
        self.api = api

    async def UpdateTaints(self, request: pb.UpdateTaintsRequest, context: Context) -> Any:
        async def body(caller: Principal) -> pb.UpdateTaintsResponse:
            changes = await self._update(request, caller)
            return pb.UpdateTaintsResponse(results=[convert.change_to_pb(c) for c in changes])

        return await self.api.call("UpdateTaints", context, body, asked=_asked(request))

    # grpc.aio lets a server-streaming handler write with context.write() and return None;
    # the generated stubs know only the generator form. Writing from the update's own
    # tasks keeps every task owned by Control.update_taints.
    async def StreamUpdateTaints(  # type: ignore[override]
        self, request: pb.UpdateTaintsRequest, context: Context
    ) -> None:
        writing = asyncio.Lock()  # the bulk update reports from several tasks at once

        async def sent(change: UpdateOutcome) -> None:
            async with writing:
                await context.write(convert.change_to_pb(change))

        async def body(caller: Principal) -> None:
            try:
                with self.api.slots.hold(caller):
                    await self._update(request, caller, progress=sent)
            except StreamLimitError as exc:  # no slot: a refused attempt, audited
                self.api.control.audit_refused(caller.name, _asked(request), exc, peer=caller.peer)
                raise

        await self.api.call("StreamUpdateTaints", context, body, asked=_asked(request))

    async def _update(
        self,
        request: pb.UpdateTaintsRequest,
        caller: Principal,
        progress: Callable[[UpdateOutcome], Awaitable[None]] | None = None,
    ) -> list[UpdateOutcome]:
        if self.api.draining:
            raise ShuttingDownError("dynamod is shutting down; retry on another replica")
        control = self.api.control
        try:
            update = TaintUpdate(
                convert.ACTION_NAMES.get(request.action, ""),  # type: ignore[arg-type]
                tuple(request.taints),
                tuple(request.keys),
            )
            target = convert.target_from_pb(request)
        except InvalidInputError as exc:
            control.audit_refused(caller.name, _asked(request), exc, peer=caller.peer)
            raise
        return await control.update_taints(
            target, update, caller=caller, dry_run=request.dry_run, progress=progress
        )


def _asked(request: pb.UpdateTaintsRequest) -> dict[str, object]:
    """What a taint update request asks for, for the audit line of a refusal (cut short:
    a refused request may be huge)."""
    which = request.WhichOneof("target")
    return {
        "action": convert.ACTION_NAMES.get(request.action, f"#{request.action}"),
        "taints": [t[:100] for t in request.taints[:20]],
        "keys": [k[:100] for k in request.keys[:20]],
        "target": str(getattr(request, which))[:100] if which else "",
        "dry_run": request.dry_run,
    }


def _page_size(asked: int) -> int:
    if asked == 0:
        return PAGE_SIZE
    if not 1 <= asked <= MAX_PAGE_SIZE:
        raise InvalidInputError(
            f"page_size {asked} is out of range; use 1 to {MAX_PAGE_SIZE}, or 0 for {PAGE_SIZE}"
        )
    return asked


class EventService(rpc.EventServiceServicer):
    def __init__(self, api: ServiceContext) -> None:
        self.api = api

    async def TailEvents(self, request: pb.TailEventsRequest, context: Context) -> Any:
        with contextlib.ExitStack() as slot:
            try:
                caller = self.api.identify(context)
                selector = parse(request.selector)
                slot.enter_context(self.api.slots.hold(caller))
            except DynamoError as exc:
                await self.api.fail("TailEvents", context, exc)
            since = request.since if request.HasField("since") else None
            view = self.api.control.view
            if request.pools and self.api.pools is not None:
                follow = not request.no_follow
                async for message in pool_service.tail(self.api, since, selector, follow, _infos):
                    yield message
            elif request.no_follow:
                for event in view.backlog(since):
                    for info in _infos(self.api.control, event, selector):
                        yield convert.event_to_pb(info)
            else:
                async for message in self._follow(since, selector):
                    yield message
        self.api.calls.labels("TailEvents", "OK").inc()

    async def _follow(self, since: int | None, selector: Selector) -> AsyncIterator[pb.Event]:
        with (
            self.api.control.view.subscribe(since=since) as subscription,
            self._tracked(subscription),
        ):
            async for event in subscription:
                for info in _infos(self.api.control, event, selector):
                    yield convert.event_to_pb(info)

    @contextlib.contextmanager
    def _tracked(self, subscription: Subscription) -> Iterator[None]:
        if self.api.draining:
            subscription.close()
        self.api.tails.add(subscription)
        try:
            yield
        finally:
            self.api.tails.discard(subscription)


def _infos(control: Control, event: DiscoveryEvent, selector: Selector) -> list[EventInfo]:
    now = event.seen
    if isinstance(event, ViewResync):
        workers = tuple(control.info(r) for r in event.records if selector.matches(r))
        return [EventInfo("RESYNC", event.revision, now, workers=workers)]
    record = event.record
    matches = selector.matches(record)
    if isinstance(event, WorkerModified) and not matches and selector:
        before = tuple(sorted(set(record.taints) - set(event.added) | set(event.removed)))
        old = replace(record, runtime_config=replace(record.runtime_config, taints=before))
        matches = selector.matches(old)
    if not matches:
        return []
    info = control.info(record)
    if isinstance(event, WorkerAdded):
        return [EventInfo("ADDED", event.revision, now, worker=info)]
    if isinstance(event, WorkerRemoved):
        return [EventInfo("REMOVED", event.revision, now, worker=info)]
    return [
        EventInfo(
            "TAINTS", event.revision, now, worker=info, added=event.added, removed=event.removed
        )
    ]


class RouterService(rpc.RouterServiceServicer):
    def __init__(self, api: ServiceContext) -> None:
        self.api = api

    async def Explain(self, request: pb.ExplainRequest, context: Context) -> Any:
        async def body(_: Principal) -> pb.ExplainResponse:
            constraints = RoutingConstraints(
                required_taints=frozenset(request.required_taints),
                preferred_taints=dict(request.preferred_taints),
                max_weight=self.api.control.max_weight,
            )
            info = await self.api.control.explain(request.model, constraints, request.prompt)
            return convert.explain_to_pb(info)

        return await self.api.call("Explain", context, body)


class StatusService(rpc.StatusServiceServicer):
    def __init__(self, api: ServiceContext) -> None:
        self.api = api

    async def GetStatus(self, request: pb.StatusRequest, context: Context) -> Any:
        async def body(_: Principal) -> pb.StatusResponse:
            return convert.status_to_pb(await self.api.control.status())

        return await self.api.call("GetStatus", context, body)


def _add_worker_service(service: WorkerService, server: aio.Server) -> None:
    """``rpc.add_WorkerServiceServicer_to_server``, but the listings' answers, already
    encoded by ``worker_pages.WorkerMessages``, go to the wire as they are."""
    name = pb.DESCRIPTOR.services_by_name["WorkerService"].full_name
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "ListWorkers": grpc.unary_unary_rpc_method_handler(
            service.ListWorkers,
            request_deserializer=pb.ListWorkersRequest.FromString,
            response_serializer=worker_pages.encoded,
        ),
        "GetWorker": grpc.unary_unary_rpc_method_handler(
            service.GetWorker,
            request_deserializer=pb.GetWorkerRequest.FromString,
            response_serializer=pb.GetWorkerResponse.SerializeToString,
        ),
        "StreamWorkers": grpc.unary_stream_rpc_method_handler(
            service.StreamWorkers,
            request_deserializer=pb.ListWorkersRequest.FromString,
            response_serializer=worker_pages.encoded,
        ),
        "WaitDrained": grpc.unary_stream_rpc_method_handler(
            service.WaitDrained,
            request_deserializer=pb.WaitDrainedRequest.FromString,
            response_serializer=pb.WaitDrainedResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)


def add_services(server: aio.Server, api: ServiceContext) -> list[str]:
    """Register every servicer on ``server``; return their full service names."""
    _add_worker_service(WorkerService(api), server)
    rpc.add_TaintServiceServicer_to_server(TaintService(api), server)
    rpc.add_EventServiceServicer_to_server(EventService(api), server)
    rpc.add_RouterServiceServicer_to_server(RouterService(api), server)
    rpc.add_StatusServiceServicer_to_server(StatusService(api), server)
    names = ["PoolService"] if api.pools is not None else []
    if api.pools is not None:
        rpc.add_PoolServiceServicer_to_server(pool_service.PoolService(api, api.pools), server)
    if api.stats is not None:
        rpc.add_StatsServiceServicer_to_server(stats_service.StatsService(api, api.stats), server)
        names.append("StatsService")
    return [
        pb.DESCRIPTOR.services_by_name[name].full_name
        for name in (
            "WorkerService",
            "TaintService",
            "EventService",
            "RouterService",
            "StatusService",
            *names,
        )
    ]
