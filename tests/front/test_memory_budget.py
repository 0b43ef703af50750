"""Whole answers are bounded in total, not only each (issue 28): what the front reads of
workers' whole answers, and holds until its clients have taken them, draws on the one
memory budget its relayed streams draw on. In process, on real sockets: a worker whose
whole answers are megabytes, many clients at once; past the budget the answer holding
the most pays: while it is read, its client gets a 503 naming the worker and the
setting; while it waits for a client that never reads, that client is cut off. The
others are answered whole, and an honest client meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from dynamod.discovery.registration import Registration
from dynamod.discovery.view import WorkerView
from dynamod.frontend import Frontend
from dynamod.http.limits import MAX_BODY
from dynamod.http.memory import MemoryBudget
from dynamod.http.openai import WORKER_ID_HEADER
from dynamod.records import WorkerRecord
from dynamod.router import Router, RouterKnobs
from dynamod.store import open_store
from dynamod.tokenizers import SimpleTokenizer
from dynamod.tokenizers.bundle import Fixed
from tests.front.test_front import MODEL
from tests.support.eventually import eventually
from tests.support.factories import make_record
from tests.support.web import Gate, served

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20


def answer(size: int) -> bytes:
    return json.dumps({"id": "w", "object": "text_completion",
                       "choices": [{"index": 0, "text": "y" * size}]}).encode()  # fmt: skip


@dataclass
class Worker:
    """Whole answers by prompt: ``gated`` sends 3 MiB but its last byte, then the rest
    once ``gate`` opens; ``big`` sends 8 MiB at once; anything else a small answer."""

    gate: Gate = field(default_factory=Gate)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        prompt = (await request.json())["prompt"]
        if prompt == "big":
            return web.Response(body=answer(8 * MIB), content_type="application/json")
        if prompt != "gated":
            return web.Response(body=answer(8), content_type="application/json")
        return await self.gate.send(request, answer(3 * MIB))


@contextlib.asynccontextmanager
async def front_of(worker: Worker, memory: MemoryBudget) -> AsyncIterator[tuple[str, str]]:
    """A front with ``memory`` before one worker served by ``worker``; its base URL and
    the worker's id."""
    registry = CollectorRegistry()
    router = Router(RouterKnobs(), rng=random.Random(0), registry=registry)
    async with await open_store("memory://") as store:
        view = WorkerView(store)
        view.listen(router.apply)
        watcher = asyncio.create_task(view.run())
        worker_app = web.Application()
        worker_app.router.add_post("/v1/{api:.*}", worker.handle)
        try:
            await asyncio.wait_for(view.ready.wait(), 10)
            front = Frontend(
                router, view, Fixed(SimpleTokenizer()), registry=registry, memory=memory
            )
            app = web.Application(client_max_size=MAX_BODY)
            front.add_to(app)
            async with served(worker_app) as worker_url:
                record: WorkerRecord = make_record(model=MODEL, address=worker_url)
                async with Registration(store, record, ttl=30), front, served(app) as base:
                    await view.wait_for(lambda v: len(v) == 1)
                    yield base, record.instance_id
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher


async def ask(
    http: aiohttp.ClientSession, base: str, prompt: str
) -> tuple[int, dict[str, Any], str]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
    async with http.post(f"{base}/v1/completions", json=body) as reply:
        return reply.status, await reply.json(), reply.headers.get(WORKER_ID_HEADER, "")


async def test_whole_answers_read_together_past_the_budget_refuse_the_largest_with_a_503(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Four clients, each asking for a 3 MiB answer, the four read at once (12 MiB) with a
    budget of 8 MiB: at least one is refused, a 503 naming the worker and
    ``memory_budget_mb``; the others get their whole answer; nothing stays held."""
    caplog.set_level(logging.WARNING, "dynamod.http.memory")
    memory = MemoryBudget(8 * MIB)
    worker = Worker()
    async with front_of(worker, memory) as (base, worker_id), aiohttp.ClientSession() as http:
        asked = [asyncio.create_task(ask(http, base, "gated")) for _ in range(4)]
        await eventually(
            lambda: asyncio.sleep(0.05, (worker.gate.waiting, memory.refusals)),
            lambda seen: seen[0] == 4 and seen[1] >= 1,
            within=60,
            what="four answers all but read, and one refused",
        )
        assert memory.held <= memory.limit
        worker.gate.opened.set()
        answers = await asyncio.gather(*asked)
    refused = [a for a in answers if a[0] == 503]
    whole = [a for a in answers if a[0] == 200]
    assert refused and whole and len(refused) + len(whole) == 4
    for _, body, named in refused:
        assert body["error"]["code"] == "memory_budget"
        assert worker_id in body["error"]["message"] and named == worker_id
        assert "memory_budget_mb = 8" in body["error"]["message"]
    for _, body, _ in whole:
        assert len(body["choices"][0]["text"]) == 3 * MIB
    assert memory.held == 0
    assert caplog.text.count("is refused: the daemon holds") == memory.refusals


@contextlib.asynccontextmanager
async def never_reading(base: str, prompt: str) -> AsyncIterator[None]:
    """A client that asks for a whole answer and never reads a byte of it."""
    where = urlsplit(base)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((where.hostname, where.port))
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 2})
    sock.sendall(
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
    )
    try:
        yield
    finally:
        sock.close()


async def test_whole_answers_held_for_clients_that_never_read_stay_within_the_budget() -> None:
    """Six clients that never read, each asking for an 8 MiB answer (48 MiB), with a budget
    of 16 MiB: the answers holding the most are dropped (their clients cut off) until the
    rest fit, and an honest client is answered meanwhile."""
    memory = MemoryBudget(16 * MIB)
    async with front_of(Worker(), memory) as (base, _), contextlib.AsyncExitStack() as clients:
        for _ in range(6):
            await clients.enter_async_context(never_reading(base, "big"))
        refusals = await eventually(
            lambda: asyncio.sleep(0.05, memory.refusals),
            lambda n: n >= 3,
            within=60,
            what="answers held for clients that never read refused",
        )
        assert refusals >= 3 and memory.held <= memory.limit
        async with aiohttp.ClientSession() as http:
            status, body, _ = await ask(http, base, "hi")
        assert status == 200 and body["choices"][0]["text"] == "y" * 8
