"""The OpenAI-compatible front, in-process on loopback, in front of real workers.

The front runs over a ``Router`` fed by a ``WorkerView`` of a real store, driven by the
official ``openai`` client. Its workers are real ``dynamo-worker`` processes sharing a file
store, or, for the failure modes a healthy worker never shows (a 5xx, silence, a stream
cut off), small aiohttp apps registered in a memory store beside an in-process mocker.
"""

from __future__ import annotations

import asyncio
import io
import random
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from dynamod.discovery.registration import Registration, new_instance_id
from dynamod.discovery.view import WorkerView
from dynamod.frontend import Frontend
from dynamod.frontend.relay import carries_output
from dynamod.http.limits import MAX_BODY, HttpLimits
from dynamod.http.openai import WORKER_ID_HEADER, openai_refusal
from dynamod.http.server import listen, serve_app, url
from dynamod.records import WorkerRecord
from dynamod.router import Router, RouterKnobs
from dynamod.store import Store, open_store
from dynamod.tokenizers import SimpleTokenizer
from dynamod.tokenizers.bundle import Fixed
from dynamod.worker.engines.mocker import MockerConfig, MockerEngine
from dynamod.worker.inference import InferenceRoutes
from tests.support.factories import make_record
from tests.support.processes import Proc, worker

pytestmark = pytest.mark.timeout(120)

MODEL = "llama"
PROMPT = "the quiet river runs north"


@asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` on a free loopback port as the daemon serves its front."""
    async with AsyncExitStack() as stack:
        listener = listen("127.0.0.1", 0)
        stack.callback(listener.close)
        yield url(*await serve_app(stack, app, listener, openai_refusal, HttpLimits()))


@dataclass
class FrontStack:
    """A front over a router over a view of ``store``, and clients for it."""

    store: Store
    router: Router
    view: WorkerView
    front: Frontend
    registry: CollectorRegistry
    url: str
    client: openai.AsyncOpenAI
    http: aiohttp.ClientSession

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    async def sees(self, *procs: Proc) -> None:
        """Wait until the view (and so the router) holds every one of ``procs``."""
        keys = [p.field("key") for p in procs]
        await self.view.wait_for(lambda v: all(v.get(k) is not None for k in keys))

    async def completion(
        self, *, max_wait: float | None = None, **constraints: Any
    ) -> tuple[str, str]:
        """(serving worker id, text) of a small completion under ``constraints``."""
        nvext: dict[str, Any] = {"routing_constraints": constraints}
        if max_wait is not None:
            nvext["max_wait"] = max_wait
        raw = await self.client.completions.with_raw_response.create(
            model=MODEL, prompt=PROMPT, max_tokens=3, extra_body={"nvext": nvext}
        )
        return raw.headers[WORKER_ID_HEADER], raw.parse().choices[0].text

    async def status_error(
        self, *, model: str = MODEL, prompt: Any = PROMPT, **extra: Any
    ) -> openai.APIStatusError:
        """The error a small completion gets, with ``extra`` body keys (``nvext``, ...)."""
        with pytest.raises(openai.APIStatusError) as caught:
            await self.client.completions.create(
                model=model, prompt=prompt, max_tokens=3, extra_body=extra
            )
        return caught.value


@asynccontextmanager
async def serve_front(
    store: Store, *, client_timeout: float = 60.0, config: RouterKnobs | None = None
) -> AsyncIterator[FrontStack]:
    """The front wired as the daemon wires it: view → router, front on loopback."""
    registry = CollectorRegistry()
    router = Router(config or RouterKnobs(), rng=random.Random(0), registry=registry)
    view = WorkerView(store)
    view.listen(router.apply)
    async with asyncio.TaskGroup() as group:
        watcher = group.create_task(view.run())
        try:
            async with asyncio.timeout(10):
                await view.ready.wait()
            front = Frontend(
                router,
                view,
                Fixed(SimpleTokenizer()),
                registry=registry,
                client_timeout=client_timeout,
            )
            app = web.Application(client_max_size=MAX_BODY)
            front.add_to(app)
            async with AsyncExitStack() as stack:
                await stack.enter_async_context(front)
                base = await stack.enter_async_context(served(app))
                # No retries in the client: a 503 or 429 must reach the test as it is.
                client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="-", max_retries=0)
                await stack.enter_async_context(client)
                http = await stack.enter_async_context(aiohttp.ClientSession())
                yield FrontStack(store, router, view, front, registry, base, client, http)
        finally:
            watcher.cancel()


@asynccontextmanager
async def workers(store_url: str, *specs: tuple[str, ...]) -> AsyncIterator[list[Proc]]:
    """``dynamo-worker`` processes, one per spec of extra flags, started side by side."""
    procs = [worker(store_url, *spec) for spec in specs]
    async with AsyncExitStack() as stack:
        for proc in procs:
            stack.push_async_callback(proc.kill)
        async with asyncio.TaskGroup() as group:
            for proc in procs:
                group.create_task(proc.start())
        yield procs


@pytest.fixture
async def file_store(tmp_path: Path) -> AsyncIterator[tuple[Store, str]]:
    url = (tmp_path / "store").as_uri()
    store = await open_store(url)
    try:
        yield store, url
    finally:
        await store.aclose()


SLOW = ("--speedup-ratio", "1")  # about 5 ms a token: a long stream stays in flight


# -- real workers


async def test_completions_and_chats_stream_and_whole_through_the_front(
    file_store: tuple[Store, str],
) -> None:
    store, url = file_store
    async with serve_front(store) as s, workers(url, ()) as [w]:
        await s.sees(w)
        raw = await s.client.completions.with_raw_response.create(
            model=MODEL, prompt=PROMPT, max_tokens=6, seed=4
        )
        assert raw.headers[WORKER_ID_HEADER] == w.field("id")
        whole = raw.parse()
        assert whole.usage is not None and whole.usage.completion_tokens == 6
        stream = await s.client.completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=6,
            seed=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        assert "".join(c.choices[0].text for c in chunks[:-1]) == whole.choices[0].text
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6

        messages: Any = [{"role": "user", "content": "hello there"}]
        chat = await s.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
        assert chat.choices[0].message.role == "assistant"
        assert len((chat.choices[0].message.content or "").split()) == 4
        raw_stream = await s.client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=4, stream=True
        )
        assert raw_stream.headers[WORKER_ID_HEADER] == w.field("id")
        assert raw_stream.headers["content-type"].startswith("text/event-stream")
        chat_chunks = [c async for c in raw_stream.parse()]
        assert chat_chunks[0].choices[0].delta.role == "assistant"
        assert len([c for c in chat_chunks[1:] if c.choices[0].delta.content]) == 4

        models = await s.client.models.list()
        assert [m.id for m in models.data] == [MODEL]
        for route in ("completions", "chat_completions"):
            assert s.metric("dynamod_front_requests_total", route=route, status="200") == 2
            assert s.metric("dynamod_front_first_byte_seconds_count", route=route) == 2
        assert s.router.load(s.view.records()[0].key).idle


async def test_required_taints_route_to_the_worker_that_holds_them(
    file_store: tuple[Store, str],
) -> None:
    store, url = file_store
    specs = [("--taint", "capacity/fast"), ("--taint", "capacity/slow", "--topology", "zone=a")]
    async with serve_front(store) as s, workers(url, *specs) as [fast, slow]:
        await s.sees(fast, slow)
        for _ in range(3):
            assert (await s.completion(required_taints=["capacity/fast"]))[0] == fast.field("id")
            assert (await s.completion(required_taints=["capacity/slow"]))[0] == slow.field("id")
        zoned = await s.completion(required_taints=["dynamo.topology/zone=a"])
        assert zoned[0] == slow.field("id")


async def test_preferred_taints_bias_the_choice_among_idle_workers(
    file_store: tuple[Store, str],
) -> None:
    store, url = file_store
    specs = [("--taint", "capacity/fast"), ("--taint", "capacity/slow")]
    async with serve_front(store) as s, workers(url, *specs) as [fast, slow]:
        await s.sees(fast, slow)
        for _ in range(3):
            served, _ = await s.completion(preferred_taints={"capacity/fast": 0.5})
            assert served == fast.field("id")
            served, _ = await s.completion(preferred_taints={"capacity/fast": -0.5})
            assert served == slow.field("id")


async def test_requests_no_worker_can_take_get_404_or_503_with_the_reason(
    file_store: tuple[Store, str],
) -> None:
    store, url = file_store
    async with serve_front(store) as s, workers(url, ("--taint", "capacity/fast")) as [w]:
        await s.sees(w)
        error = await s.status_error(model="gpt-9")
        assert error.status_code == 404
        assert error.body == {
            "message": "no worker serves model 'gpt-9'; workers serve 'llama'",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
        constraints = {"required_taints": ["capacity/huge"]}
        error = await s.status_error(nvext={"routing_constraints": constraints})
        assert error.status_code == 503
        assert isinstance(error.body, dict) and error.body["code"] == "no_eligible_worker"
        assert error.body["message"] == (
            f"no worker of model 'llama' has capacity/huge; 1 worker: {w.field('id')} has "
            "capacity/fast (missing capacity/huge)"
        )
        assert WORKER_ID_HEADER not in error.response.headers
        assert s.metric("dynamod_front_requests_total", route="completions", status="503") == 1


async def test_a_worker_killed_while_still_in_the_view_is_retried_on_another(
    file_store: tuple[Store, str],
) -> None:
    store, url = file_store
    # The doomed worker's record outlives it by 30 s, so the router still picks it.
    specs = [("--taint", "capacity/fast", "--lease-ttl", "30"), ()]
    async with serve_front(store) as s, workers(url, *specs) as [doomed, other]:
        await s.sees(doomed, other)
        doomed.send(signal.SIGKILL)
        await doomed.wait()
        served, text = await s.completion(preferred_taints={"capacity/fast": 1.0})
        assert served == other.field("id") and len(text.split()) == 3
        assert s.view.get(doomed.field("key")) is not None
        assert s.metric("dynamod_front_retries_total", reason="unreachable") == 1
        assert all(s.router.load(r.key).idle for r in s.view.records())


async def test_a_worker_dying_mid_stream_ends_the_stream_with_an_error_event(
    file_store: tuple[Store, str],
) -> None:
    store, url = file_store
    async with serve_front(store) as s, workers(url, SLOW) as [w]:
        await s.sees(w)
        stream = await s.client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=4000, stream=True
        )
        first = await anext(aiter(stream))
        assert first.choices[0].text
        w.send(signal.SIGKILL)
        with pytest.raises(openai.APIError, match=f"worker {w.field('id')} failed mid-stream"):
            async for _ in stream:
                pass
        async with asyncio.timeout(10):
            await s.front.wait_idle()
        assert s.router.load(w.field("key")).idle


async def test_a_client_that_disconnects_cancels_the_request_on_the_worker(
    file_store: tuple[Store, str],
) -> None:
    store, url = file_store
    # With a 2 s grace, a worker still generating at SIGTERM would exit 70, not 0.
    async with serve_front(store) as s, workers(url, (*SLOW, "--grace", "2")) as [w]:
        await s.sees(w)
        stream = await s.client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=4000, stream=True
        )
        await anext(aiter(stream))
        await stream.close()
        async with asyncio.timeout(10):
            await s.front.wait_idle()
        assert s.router.load(w.field("key")).idle
        assert s.metric("dynamod_front_requests_total", route="completions", status="499") == 1
        assert await w.stop(signal.SIGTERM) == 0


async def test_draining_refuses_new_requests_and_waits_for_those_in_flight(
    file_store: tuple[Store, str],
) -> None:
    store, url = file_store
    async with serve_front(store) as s, workers(url, SLOW) as [w]:
        await s.sees(w)
        stream = await s.client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=100, stream=True
        )
        await anext(aiter(stream))
        # The first output event ended the prefill; the request still holds the worker.
        load = s.router.load(w.field("key"))
        assert (load.active_requests, load.prefill_tokens) == (1, 0)
        s.front.begin_drain()
        error = await s.status_error()
        assert error.status_code == 503
        assert isinstance(error.body, dict) and error.body["code"] == "draining"
        assert s.front.in_flight == 1
        rest = [c async for c in stream]
        assert rest[-1].choices[0].finish_reason == "length"
        async with asyncio.timeout(10):
            await s.front.wait_idle()


# -- no worker needed


def test_the_prefill_ends_at_the_first_output_event_not_at_the_chat_role_announcement() -> None:
    opener = (
        b'data: {"object":"chat.completion.chunk","choices":[{"index":0,'
        b'"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
    )
    token = b'data: {"object":"chat.completion.chunk","choices":[{"delta":{"content":" the"}}]}'
    assert not carries_output(opener)
    assert carries_output(token + b"\n\n")
    assert carries_output(b'data: {"object":"text_completion","choices":[{"text":" a"}]}\n\n')
    assert carries_output(b'data: {"error":{"message":"engine stopped"}}\n\n')
    assert carries_output(b"data: [DONE]\n\n")


async def test_malformed_requests_get_400_naming_the_problem() -> None:
    async with await open_store("memory://") as store, serve_front(store) as s:
        cases: list[tuple[dict[str, Any], str, str]] = [
            (
                {"nvext": {"routing_constraints": {"required_taint": ["capacity/fast"]}}},
                "nvext.routing_constraints",
                "routing_constraints has unknown key 'required_taint'; allowed keys are "
                "'required_taints' and 'preferred_taints'",
            ),
            (
                {"nvext": {"routing_constraints": {"preferred_taints": {"gpu": 3}}}},
                "nvext.routing_constraints",
                "preferred taint 'gpu' has weight 3.0; weights must be from -1 to 1",
            ),
            (
                {"nvext": {"max_wait": -1}},
                "nvext.max_wait",
                "nvext.max_wait must be a number of seconds from 0 to 1e9; got -1",
            ),
            (
                {"prompt": {"text": "hi"}},
                "prompt",
                "prompt must be a string or a list of token ids (one prompt), got {'text': 'hi'}",
            ),
        ]
        for body, param, message in cases:
            error = await s.status_error(**body)
            assert error.status_code == 400
            assert error.body == {
                "message": message,
                "type": "invalid_request_error",
                "param": param,
                "code": "invalid_value",
            }
        async with s.http.post(f"{s.url}/v1/chat/completions", data=b"{oops") as response:
            assert response.status == 400
            reply = await response.json()
        assert reply["error"]["message"].startswith("the request body is not valid JSON: ")
        big = b'{"prompt": "' + b"a" * MAX_BODY + b'"}'  # over the limit workers share
        async with s.http.post(f"{s.url}/v1/completions", data=io.BytesIO(big)) as response:
            assert response.status == 413
            reply = await response.json()
        assert reply["error"]["message"].startswith("the request body is over the limit of ")
        assert s.metric("dynamod_front_requests_total", route="completions", status="400") == 4


async def test_a_model_without_workers_gets_404_and_no_listing() -> None:
    async with await open_store("memory://") as store, serve_front(store) as s:
        error = await s.status_error()
        assert error.status_code == 404
        assert isinstance(error.body, dict)
        assert error.body["message"] == "no worker serves model 'llama'; no workers are registered"
        assert (await s.client.models.list()).data == []


# -- in-process workers with the failures real ones rarely show

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def fake_worker(store: Store, handler: Handler, *taints: str) -> AsyncIterator[WorkerRecord]:
    """A registered worker whose inference routes all answer with ``handler``."""
    app = web.Application()
    app.router.add_post("/v1/{api:.*}", handler)
    async with served(app) as url:
        record = make_record(model=MODEL, taints=taints, address=url)
        async with Registration(store, record, ttl=30):
            yield record


@asynccontextmanager
async def mocker_worker(store: Store) -> AsyncIterator[WorkerRecord]:
    """A healthy worker: the mocker engine and the real inference routes, in-process."""
    config = MockerConfig(model_name=MODEL, speedup_ratio=100.0)
    instance_id = new_instance_id()
    async with MockerEngine(config) as engine:
        app = web.Application()
        InferenceRoutes(engine, instance_id).add_to(app)
        async with served(app) as url:
            record = make_record(model=MODEL, instance_id=instance_id, address=url)
            async with Registration(store, record, ttl=30):
                yield record


async def answer_500(request: web.Request) -> web.Response:
    error = {"message": "the engine fell over", "type": "server_error", "code": "oops"}
    return web.json_response({"error": error}, status=500)


async def never_answer(request: web.Request) -> web.Response:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def stream_then_cut(request: web.Request) -> web.StreamResponse:
    """One event, half of another, then the connection is dropped."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b'data: {"id":"x","object":"text_completion","choices":[]}\n\n')
    await response.write(b'data: {"id":"x","obj')
    assert request.transport is not None
    request.transport.close()
    return response


async def stream_without_done(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b'data: {"id":"x","object":"text_completion","choices":[]}\n\n')
    await response.write_eof()
    return response


@pytest.mark.parametrize(
    ("handler", "reason", "status", "said"),
    [
        (answer_500, "status", 500, "answered 500: the engine fell over"),
        (never_answer, "timeout", 504, "did not answer: it was silent for 0.5 s"),
    ],
)
async def test_a_worker_failing_before_its_first_byte_is_retried_once_elsewhere(
    handler: Handler, reason: str, status: int, said: str
) -> None:
    async with (
        await open_store("memory://") as store,
        serve_front(store, client_timeout=0.5) as s,
        fake_worker(store, handler, "bad") as bad,
        mocker_worker(store) as good,
    ):
        await s.view.wait_for(lambda v: len(v) == 2)
        prefer_bad = {"nvext": {"routing_constraints": {"preferred_taints": {"bad": 1.0}}}}
        raw = await s.client.completions.with_raw_response.create(
            model=MODEL, prompt=PROMPT, max_tokens=2, extra_body=prefer_bad
        )
        assert raw.headers[WORKER_ID_HEADER] == good.instance_id
        assert s.metric("dynamod_front_retries_total", reason=reason) == 1

        error = await s.status_error(nvext={"routing_constraints": {"required_taints": ["bad"]}})
        assert error.status_code == status
        assert error.response.headers[WORKER_ID_HEADER] == bad.instance_id
        assert isinstance(error.body, dict)
        assert error.body["message"] == (
            f"worker {bad.instance_id} at {bad.address}/v1/completions {said}; no other worker "
            f"could take the request: no worker of model 'llama' has bad; 2 workers: "
            f"{bad.instance_id} is excluded by the request, {good.instance_id} has no taints "
            "(missing bad)"
        )
        assert s.metric("dynamod_front_retries_total", reason=reason) == 2


@pytest.mark.parametrize(
    ("handler", "said"),
    [(stream_then_cut, "failed mid-stream: "), (stream_without_done, "ended the stream without")],
)
async def test_a_stream_that_breaks_ends_with_one_error_event_and_done(
    handler: Handler, said: str
) -> None:
    async with (
        await open_store("memory://") as store,
        serve_front(store) as s,
        fake_worker(store, handler) as bad,
    ):
        await s.view.wait_for(lambda v: len(v) == 1)
        body = {"model": MODEL, "prompt": PROMPT, "stream": True}
        async with s.http.post(f"{s.url}/v1/completions", json=body) as response:
            assert response.headers[WORKER_ID_HEADER] == bad.instance_id
            events = (await response.read()).split(b"\n\n")
        assert events[0] == b'data: {"id":"x","object":"text_completion","choices":[]}'
        assert events[1].startswith(
            b'data: {"error":{"message":"worker ' + bad.instance_id.encode()
        )
        assert said.encode() in events[1]
        assert events[2:] == [b"data: [DONE]", b""]
        assert s.metric("dynamod_front_retries_total", reason="status") == 0
