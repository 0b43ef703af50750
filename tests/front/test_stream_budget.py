"""What relayed streams hold for clients that never read is bounded in total (issue 28:
one worker sending 10 MB events and 30 clients that never read took the daemon from 76 to
703 MB). In process, on real sockets: a worker streaming 1 MiB events, clients that send
a request and read nothing; with a memory budget of 8 MiB the streams holding the most are
dropped, what all hold stays within the budget, and an honest client is answered
meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import socket
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from dynamod.discovery.registration import Registration
from dynamod.discovery.view import WorkerView
from dynamod.frontend import Frontend
from dynamod.http.limits import MAX_BODY, AnswerLimits
from dynamod.http.memory import MemoryBudget
from dynamod.router import Router, RouterKnobs
from dynamod.store import open_store
from dynamod.tokenizers import SimpleTokenizer
from dynamod.tokenizers.bundle import Fixed
from tests.front.test_front import MODEL
from tests.support.eventually import eventually
from tests.support.factories import make_record
from tests.support.web import served

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
BUDGET = 8 * MIB
EVENT = b"data: " + json.dumps({"id": "x", "choices": [{"text": "y" * MIB}]}).encode() + b"\n\n"
SILENT_CLIENTS = 12


async def endless(request: web.Request) -> web.StreamResponse:
    """1 MiB events until the front stops reading; a whole answer when not streamed."""
    body = await request.json()
    if not body.get("stream"):
        return web.json_response({"id": "w", "object": "text_completion", "choices": []})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    with contextlib.suppress(ConnectionError):
        while True:
            await response.write(EVENT)
    return response


@contextlib.asynccontextmanager
async def silent_client(base: str) -> AsyncIterator[socket.socket]:
    """A client that asks for a stream and never reads a byte of it."""
    where = urlsplit(base)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((where.hostname, where.port))
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 9, "stream": True})
    sock.sendall(
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
    )
    try:
        yield sock
    finally:
        sock.close()


async def test_streams_to_clients_that_never_read_stay_within_one_budget(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "dynamod.http.memory")
    registry = CollectorRegistry()
    router = Router(RouterKnobs(), rng=random.Random(0), registry=registry)
    limits = AnswerLimits(event=2 * MIB)
    memory = MemoryBudget(BUDGET)
    async with await open_store("memory://") as store:
        view = WorkerView(store)
        view.listen(router.apply)
        watcher = asyncio.create_task(view.run())
        worker_app = web.Application()
        worker_app.router.add_post("/v1/{api:.*}", endless)
        try:
            await asyncio.wait_for(view.ready.wait(), 10)
            front = Frontend(
                router,
                view,
                Fixed(SimpleTokenizer()),
                registry=registry,
                limits=limits,
                memory=memory,
            )
            app = web.Application(client_max_size=MAX_BODY)
            front.add_to(app)
            async with (
                served(worker_app) as worker_url,
                Registration(store, make_record(model=MODEL, address=worker_url), ttl=30),
                front,
                served(app) as base,
                contextlib.AsyncExitStack() as clients,
            ):
                await view.wait_for(lambda v: len(v) == 1)
                for _ in range(SILENT_CLIENTS):
                    await clients.enter_async_context(silent_client(base))
                dropped = await eventually(
                    lambda: asyncio.sleep(0.05, caplog.text.count("to a client is refused")),
                    lambda n: n >= 2,
                    within=60,
                    what="streams dropped for their budget",
                )
                assert dropped >= 2
                assert memory.held <= BUDGET
                async with aiohttp.ClientSession() as http:
                    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
                    async with http.post(f"{base}/v1/completions", json=body) as reply:
                        assert reply.status == 200
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
