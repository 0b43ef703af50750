"""``AsyncClient``: the daemon's gRPC API for asyncio code; dynamoctl is built on it.

Endpoints: ``unix:///run/dynamod/dynamod.sock`` (or a bare path) for the local socket,
``host:port`` for TCP (with ``tls=True`` for TLS, ``ca`` / ``cert`` / ``key`` for mTLS).
Every call has a deadline. gRPC errors come back as our own classes (``api/status.py``);
an endpoint that does not answer raises ``UnreachableError`` naming it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from grpc import aio

from dynamod.api import convert
from dynamod.api.status import ERROR_KEY, from_status
from dynamod.api.v1 import dynamo_pb2 as pb
from dynamod.api.v1 import dynamo_pb2_grpc as rpc
from dynamod.errors import DynamoError, UnreachableError
from dynamod.model import ModelCard
from dynamod.paths import default_socket
from dynamod.reports import (
    EventInfo,
    ExplainInfo,
    StatusInfo,
    TaintChange,
    WorkerInfo,
    WorkerPage,
)
from dynamod.taints import TaintUpdate

# As large as the server allows: 10,000 workers listed are about 7 MB.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]


def default_endpoint() -> str:
    """The daemon's default unix socket (see ``dynamod.paths``)."""
    return "unix://" + str(default_socket())


def target_of(endpoint: str) -> str:
    """``/path`` → ``unix:///path``; ``unix://...`` and ``host:port`` stay as they are."""
    if endpoint.startswith("/"):
        return "unix://" + endpoint
    return endpoint


@dataclass(frozen=True)
class Credentials:
    token: str | None = None
    tls: bool = False
    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None


class AsyncClient:
    """Async client; use ``async with AsyncClient(endpoint) as client``."""

    def __init__(
        self, endpoint: str, *, credentials: Credentials | None = None, timeout: float = 10.0
    ) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._credentials = credentials or Credentials()
        self._channel = self._open(target_of(endpoint))
        self._workers = rpc.WorkerServiceStub(self._channel)
        self._taints = rpc.TaintServiceStub(self._channel)
        self._events = rpc.EventServiceStub(self._channel)
        self._router = rpc.RouterServiceStub(self._channel)
        self._status = rpc.StatusServiceStub(self._channel)

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
        await self._channel.close(grace=None)

    def _metadata(self) -> list[tuple[str, str]]:
        token = self._credentials.token
        return [("authorization", f"Bearer {token}")] if token else []

    async def _call(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, timeout=self.timeout, metadata=self._metadata())
        except aio.AioRpcError as exc:
            raise self._error(exc) from None

    def _error(self, exc: aio.AioRpcError) -> DynamoError:
        trailing = dict(exc.trailing_metadata() or ())
        name = trailing.get(ERROR_KEY)
        error = from_status(
            exc.code(), exc.details() or "", name if isinstance(name, str) else None
        )
        if isinstance(error, UnreachableError):
            return UnreachableError(
                f"cannot reach dynamod at {self.endpoint} ({exc.details()}); is it running? "
                "Set another endpoint with --endpoint or DYNAMO_ENDPOINT"
            )
        return error

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
        request = _list_request(model, selector, namespace, component, endpoint, fields)
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
        request = _list_request(model, selector, namespace, component, endpoint, fields)
        request.page_size = page_size
        call = self._workers.StreamWorkers(request, timeout=self.timeout, metadata=self._metadata())
        cards: dict[str, ModelCard] = {}
        async for reply in self._stream(call):
            workers = [convert.worker_from_pb(m, cards) for m in reply.workers]
            yield WorkerPage(workers, reply.revision, reply.id_prefix)

    async def get_worker(self, ref: str) -> WorkerInfo:
        reply = await self._call(self._workers.GetWorker, pb.GetWorkerRequest(id=ref))
        return convert.worker_from_pb(reply.worker)

    async def update_taints(
        self,
        update: TaintUpdate,
        *,
        worker: str | None = None,
        selector: str | None = None,
        all_workers: bool = False,
        expect_revision: int | None = None,
        dry_run: bool = False,
    ) -> list[TaintChange]:
        """Apply ``update`` to a worker, the workers a selector matches, or all of them.
        Per-worker failures of a bulk update are in each change's ``error``."""
        request = _update_request(update, worker, selector, all_workers, expect_revision, dry_run)
        reply = await self._call(self._taints.UpdateTaints, request)
        return [convert.change_from_pb(c) for c in reply.results]

    async def stream_update_taints(
        self,
        update: TaintUpdate,
        *,
        worker: str | None = None,
        selector: str | None = None,
        all_workers: bool = False,
        dry_run: bool = False,
    ) -> AsyncGenerator[TaintChange, None]:
        """``update_taints``, each worker's outcome as soon as the daemon has it (in no set
        order): for progress on a bulk update."""
        request = _update_request(update, worker, selector, all_workers, None, dry_run)
        call = self._taints.StreamUpdateTaints(
            request, timeout=self.timeout, metadata=self._metadata()
        )
        async for message in self._stream(call):
            yield convert.change_from_pb(message)

    async def tail_events(
        self, *, since: int | None = None, selector: str = "", follow: bool = True
    ) -> AsyncGenerator[EventInfo, None]:
        """Discovery events; ends when the daemon ends the stream (or at once with
        ``follow=False`` after what is known)."""
        request = pb.TailEventsRequest(selector=selector, no_follow=not follow)
        if since is not None:
            request.since = since
        call = self._events.TailEvents(request, metadata=self._metadata())
        async for message in self._stream(call):
            yield convert.event_from_pb(message)

    async def _stream(self, call: Any) -> AsyncGenerator[Any, None]:
        """The messages of a server stream, its errors as ours; cancelled when left."""
        try:
            async for message in call:
                yield message
        except aio.AioRpcError as exc:
            raise self._error(exc) from None
        finally:
            call.cancel()

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


def _list_request(
    model: str, selector: str, namespace: str, component: str, endpoint: str, fields: Iterable[str]
) -> pb.ListWorkersRequest:
    return pb.ListWorkersRequest(
        model=model,
        selector=selector,
        namespace=namespace,
        component=component,
        endpoint=endpoint,
        fields=list(fields),
    )


def _update_request(
    update: TaintUpdate,
    worker: str | None,
    selector: str | None,
    all_workers: bool,
    expect_revision: int | None,
    dry_run: bool,
) -> pb.UpdateTaintsRequest:
    request = pb.UpdateTaintsRequest(
        action=convert.ACTIONS[update.action],
        taints=list(update.taints),
        keys=list(update.keys),
        dry_run=dry_run,
    )
    if worker is not None:
        request.worker = worker
    elif selector is not None:
        request.selector = selector
    elif all_workers:
        request.all = True
    if expect_revision is not None:
        request.expect_revision = expect_revision
    return request
