"""The gRPC PoolService (pool policies) and the pool events of ``TailEvents``.

Each call is identified, counted and its errors mapped exactly as the other servicers'
(``ServiceContext.call``); the work is ``pools.operations.PoolOperations``. A tail that
asks for pool events (``TailEventsRequest.pools``) gets the worker view's events and the
pool events (``pools.events``) interleaved in the order this daemon learned them; with
``since`` both are replayed from their histories, merged by revision.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from dynamod.api import convert, pool_convert
from dynamod.api.context import Context
from dynamod.api.v1 import dynamo_pb2 as pb
from dynamod.api.v1 import dynamo_pb2_grpc as rpc
from dynamod.auth import Principal
from dynamod.discovery.view import Subscription
from dynamod.discovery_events import DiscoveryEvent
from dynamod.errors import ShuttingDownError, UnsupportedError, WorkerNotFoundError
from dynamod.pools.operations import PoolOperations
from dynamod.pools.pool_events import PoolEvent, PoolEvents, PoolSubscription
from dynamod.reports import EventInfo
from dynamod.selectors import Selector
from dynamod.store.dynamo.url import is_dynamo


class PoolService(rpc.PoolServiceServicer):
    def __init__(self, api: Any, pools: PoolOperations) -> None:
        """``api``: the ``service.ServiceContext`` (not imported: it imports this module)."""
        self.api = api
        self.pools = pools

    async def ApplyPolicy(self, request: pb.ApplyPolicyRequest, context: Context) -> Any:
        async def body(caller: Principal) -> pb.ApplyPolicyResponse:
            self._refuse_if_draining()
            self._refuse_without_state_store()
            outcome = await self.pools.apply(
                request.document, caller=caller, dry_run=request.dry_run
            )
            return pool_convert.apply_to_pb(outcome)

        return await self.api.call("ApplyPolicy", context, body)

    async def ListPolicies(self, request: pb.ListPoliciesRequest, context: Context) -> Any:
        async def body(_: Principal) -> pb.ListPoliciesResponse:
            policies = await self.pools.list()
            return pb.ListPoliciesResponse(
                policies=[pool_convert.policy_to_pb(p) for p in policies]
            )

        return await self.api.call("ListPolicies", context, body)

    async def GetPolicy(self, request: pb.PolicyRequest, context: Context) -> Any:
        async def body(_: Principal) -> pb.PolicyResponse:
            info = await self.pools.get(request.name)
            return pb.PolicyResponse(policy=pool_convert.policy_to_pb(info))

        return await self.api.call("GetPolicy", context, body)

    async def GetPoolStatus(self, request: pb.PolicyRequest, context: Context) -> Any:
        async def body(_: Principal) -> pb.PoolStatusResponse:
            return pool_convert.status_to_pb(await self.pools.status(request.name))

        return await self.api.call("GetPoolStatus", context, body)

    async def PausePolicy(self, request: pb.PolicyRequest, context: Context) -> Any:
        return await self._pause("PausePolicy", request, context, paused=True)

    async def ResumePolicy(self, request: pb.PolicyRequest, context: Context) -> Any:
        return await self._pause("ResumePolicy", request, context, paused=False)

    async def _pause(
        self, method: str, request: pb.PolicyRequest, context: Context, *, paused: bool
    ) -> Any:
        async def body(caller: Principal) -> pb.PolicyResponse:
            self._refuse_if_draining()
            self._refuse_without_state_store()
            info, changed = await self.pools.set_paused(request.name, paused, caller=caller)
            return pb.PolicyResponse(policy=pool_convert.policy_to_pb(info), changed=changed)

        return await self.api.call(method, context, body)

    async def RemovePolicy(self, request: pb.PolicyRequest, context: Context) -> Any:
        async def body(caller: Principal) -> pb.RemovePolicyResponse:
            self._refuse_if_draining()
            self._refuse_without_state_store()
            return pool_convert.remove_to_pb(await self.pools.remove(request.name, caller=caller))

        return await self.api.call("RemovePolicy", context, body)

    def _refuse_without_state_store(self) -> None:
        """A change of pool policies (a dry run too: it would pretend the apply could be
        made) needs a store dynamod can write; a Dynamo fleet's is read only."""
        url = self.pools.store.url
        if is_dynamo(url):
            raise UnsupportedError(
                f"pool policies need a state store dynamod can write, and {url} is an NVIDIA "
                "Dynamo fleet's, which dynamod only reads: set state_store (environment "
                "DYNAMO_STATE_STORE, flag --state-store), e.g. "
                "DYNAMO_STATE_STORE=etcd://10.0.0.1:2379/dynamod or "
                "file:///var/lib/dynamod/state, and restart dynamod"
            )

    def _refuse_if_draining(self) -> None:
        if self.api.draining:
            raise ShuttingDownError("dynamod is shutting down; retry on another replica")


def pool_info(event: PoolEvent, selector: Selector, find: Any) -> EventInfo | None:
    """``event`` as ``events tail`` sends it; None when ``selector`` leaves it out (with a
    selector, only moves and drift of workers it matches, as this daemon's view has them:
    ``find(worker id)`` returns the record or None)."""
    info = event.info
    if selector:
        record = find(info.worker) if info.worker else None
        if record is None or not selector.matches(record):
            return None
    return EventInfo("POOL", event.revision, event.seen, pool=info)


@contextlib.asynccontextmanager
async def merged(
    workers: Subscription, pools: PoolSubscription
) -> AsyncIterator[AsyncIterator[DiscoveryEvent | PoolEvent]]:
    """Both subscriptions as one stream, each event as it comes. One pending ``__anext__``
    per source is kept across iterations (so none is lost) and cancelled on exit."""
    sources: dict[asyncio.Future[Any], Any] = {}

    def pending(source: Any) -> None:
        sources[asyncio.ensure_future(source.__anext__())] = source

    async def events() -> AsyncIterator[DiscoveryEvent | PoolEvent]:
        pending(workers)
        pending(pools)
        while sources:
            done, _ = await asyncio.wait(sources, return_when=asyncio.FIRST_COMPLETED)
            for future in sorted(done, key=lambda f: isinstance(sources[f], PoolSubscription)):
                source = sources.pop(future)
                try:
                    event = future.result()
                except StopAsyncIteration:
                    return  # one ended (the daemon is draining): the tail ends
                pending(source)
                yield event

    try:
        yield events()
    finally:
        for future in sources:
            future.cancel()
        await asyncio.gather(*sources, return_exceptions=True)


def backlog(
    discovery: list[DiscoveryEvent], pools: PoolEvents, since: int | None
) -> Iterator[DiscoveryEvent | PoolEvent]:
    """What a tail from ``since`` replays without following: both histories merged by
    revision (the worker view's may be one RESYNC snapshot, at the view's revision)."""
    pool_events = pools.backlog(since)
    merged_events: list[DiscoveryEvent | PoolEvent] = [*discovery, *pool_events]
    return iter(sorted(merged_events, key=lambda e: e.revision))


Infos = Callable[[Any, DiscoveryEvent, Selector], list[EventInfo]]


async def tail(
    api: Any, since: int | None, selector: Selector, follow: bool, infos: Infos
) -> AsyncIterator[pb.Event]:
    """``TailEvents`` with pool events (see the module docstring). ``infos`` turns a
    discovery event into what the tail sends (``service._infos``)."""
    control = api.control
    events: PoolEvents = api.pools.reconciler.events

    def find(worker: str) -> Any:
        try:
            return control.view.find(worker)
        except WorkerNotFoundError:
            return None

    def converted(event: DiscoveryEvent | PoolEvent) -> list[EventInfo]:
        if isinstance(event, PoolEvent):
            info = pool_info(event, selector, find)
            return [] if info is None else [info]
        return infos(control, event, selector)

    if not follow:
        for event in backlog(control.view.backlog(since), events, since):
            for info in converted(event):
                yield convert.event_to_pb(info)
        return
    with (
        control.view.subscribe(since=since) as workers,
        events.subscribe(since=since) as pools,
        _tracked(api, workers),
    ):
        async with merged(workers, pools) as stream:
            async for event in stream:
                for info in converted(event):
                    yield convert.event_to_pb(info)


@contextlib.contextmanager
def _tracked(api: Any, subscription: Subscription) -> Iterator[None]:
    """As ``EventService._tracked``: a draining daemon ends the tail."""
    if api.draining:
        subscription.close()
    api.tails.add(subscription)
    try:
        yield
    finally:
        api.tails.discard(subscription)
