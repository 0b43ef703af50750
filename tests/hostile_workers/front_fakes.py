"""Hostile peers of the front and of the ``--engine openai`` worker, as real processes.

``python -m tests.hostile_workers.front_fakes worker --store URL --mode MODE ...``: an
aiohttp app that registers a worker record in the store like a worker (its lease kept
alive by ``Registration``) and then answers inference requests the way ``MODE`` says:

* ``small``: an honest small completion (or a stream of two events); with ``--context
  2``, from a card that says so — a worker started with another ``max_model_len``, or a
  hostile record (the card's context is the mocker's otherwise);
* ``huge``: ``--size-mb`` MiB made as they are sent: a whole JSON answer that never
  ends, or (``stream``) a stream whose first event never ends;
* ``huge-later-event``: one good event, then an event that never ends;
* ``large``: an honest whole completion of ``--size-mb`` MiB of text.

Its card reads bodies as the honest mockers do (their tokenizer, block size and engine)
unless ``--block-size`` says otherwise (a worker that disagrees). It serves its tokenizer
bundle on the same port (its system address) and offers no engine events. Ready line:
``front-fake worker ready: id=... http=... key=...``.

``python -m tests.hostile_workers.front_fakes upstream --mode MODE``: an OpenAI-compatible
server for the ``--engine openai`` worker to front: ``/health`` 200; ``/v1/models`` lists
``llama`` (``bool-context``: with ``"max_model_len": true``; ``list-models``: a bare list);
``/metrics`` serves a good vLLM page until ``POST /control/metrics`` replaces it (any
text); ``/v1/completions`` answers by mode: ``huge`` as above,
``half-event`` (one event, half of the next, then the connection is dropped),
``slow-stream`` (an event every 0.1 s for a minute), else a small honest answer. Ready
line: ``front-fake upstream ready: url=...``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gzip
import json
import time

from aiohttp import web

from dynamod.discovery.registration import Registration
from dynamod.records import ModelCard, RuntimeConfig, WorkerRecord
from dynamod.store import open_store
from dynamod.taints import normalize
from dynamod.tokenizers import SimpleTokenizer
from dynamod.tokenizers.bundle import PATH as TOKENIZER_PATH
from dynamod.tokenizers.bundle import published, with_tokenizer
from dynamod.worker.engines.mocker import MockerConfig
from tests.support.web import served, until_signalled

MODEL = "llama"
PIECE = b"a" * 65536
GOOD_EVENT = b'data: {"id":"x","object":"text_completion","model":"llama","choices":[{"index":0,"text":" hi","finish_reason":null}]}\n\n'  # noqa: E501
LAST_EVENT = b'data: {"id":"x","object":"text_completion","model":"llama","choices":[{"index":0,"text":" there","finish_reason":"length"}]}\n\n'  # noqa: E501
DONE = b"data: [DONE]\n\n"
VLLM_PAGE = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 0.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.0
"""


def completion(text: str = " hi there") -> dict[str, object]:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    return {
        "id": "cmpl-fake",
        "object": "text_completion",
        "created": 0,
        "model": MODEL,
        "choices": [choice],
        "usage": usage,
    }


async def _stream(request: web.Request, *pieces: bytes) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for piece in pieces:
        await response.write(piece)
    await response.write_eof()
    return response


async def _endless(
    request: web.Request, head: bytes, size_mb: int, kind: str
) -> web.StreamResponse:
    """``head``, then ``size_mb`` MiB of one JSON string that never closes, made as it is
    sent: the fake itself holds one piece at a time."""
    response = web.StreamResponse(headers={"Content-Type": kind})
    await response.prepare(request)
    with contextlib.suppress(ConnectionResetError):
        await response.write(head)
        for _ in range(size_mb * 1024 * 1024 // len(PIECE)):
            await response.write(PIECE)
        await response.write_eof()
    return response


async def _answer(request: web.Request, mode: str, size_mb: int) -> web.StreamResponse:
    body = await request.json()
    stream = bool(body.get("stream"))
    if mode == "huge" and not stream:
        return await _endless(request, b'{"id":"', size_mb, "application/json")
    if mode == "huge":
        return await _endless(request, b'data: {"id":"', size_mb, "text/event-stream")
    if mode == "empty" and not stream:  # 200 and no body at all
        return web.Response(status=200, body=b"", content_type="application/json")
    if mode == "not-json" and not stream:
        return web.Response(status=200, body=b"<html>ok</html>", content_type="application/json")
    if mode == "gzip-bomb" and not stream:  # a few hundred KiB that inflate to size_mb MiB
        bomb = _bomb(size_mb)
        headers = {"Content-Encoding": "gzip"}
        return web.Response(body=bomb, headers=headers, content_type="application/json")
    if mode == "gzip" and not stream:  # an honest answer, compressed although not asked to be
        body = gzip.compress(json.dumps(completion()).encode())
        headers = {"Content-Encoding": "gzip"}
        return web.Response(body=body, headers=headers, content_type="application/json")
    if mode == "large" and not stream:
        return web.json_response(completion("y" * (size_mb << 20)))
    if mode == "huge-later-event":
        return await _endless(request, GOOD_EVENT + b'data: {"id":"', size_mb, "text/event-stream")
    if mode == "half-event":
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(GOOD_EVENT)
        await response.write(b'data: {"id":"x","obj')
        assert request.transport is not None
        request.transport.close()
        return response
    if mode == "slow-stream":
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionResetError):
            for _ in range(600):
                await response.write(GOOD_EVENT)
                await asyncio.sleep(0.1)
        return response
    if stream:
        return await _stream(request, GOOD_EVENT, LAST_EVENT, DONE)
    return web.json_response(completion())


@functools.cache
def _bomb(size_mb: int) -> bytes:
    """``size_mb`` MiB of spaces, gzipped once (a few hundred KiB)."""
    return gzip.compress(b" " * (size_mb << 20), compresslevel=6)


def _inference_app(mode: str, size_mb: int) -> web.Application:
    app = web.Application()

    async def handler(request: web.Request) -> web.StreamResponse:
        return await _answer(request, mode, size_mb)

    app.router.add_post("/v1/completions", handler)
    app.router.add_post("/v1/chat/completions", handler)
    return app


async def run_worker(args: argparse.Namespace) -> None:
    tokenizer = SimpleTokenizer()
    app = _inference_app(args.mode, args.size_mb)

    async def bundle(request: web.Request) -> web.Response:
        return web.Response(body=published(tokenizer), content_type="application/json")

    app.router.add_get(TOKENIZER_PATH, bundle)
    async with served(app) as url:
        await register_worker(args, tokenizer, url)


async def register_worker(args: argparse.Namespace, tokenizer: SimpleTokenizer, url: str) -> None:
    mocker = MockerConfig()
    card = ModelCard(
        MODEL,
        engine="mocker",
        kv_block_size=args.block_size or mocker.block_size,
        context_length=args.context,
    )
    record = WorkerRecord(
        instance_id=args.id,
        namespace="dynamo",
        component="backend",
        endpoint="generate",
        address=url,
        system_address=url,
        model_card=with_tokenizer(card, tokenizer),
        runtime_config=RuntimeConfig(taints=normalize(args.taint)),
        started_at=time.time(),
        host="front-fake",
        pid=0,
        version="fake",
    )
    async with await open_store(args.store) as store, Registration(store, record, ttl=2):
        print(
            f"front-fake worker ready: id={record.instance_id} http={url} key={record.key}",
            flush=True,
        )
        await until_signalled()


async def run_upstream(args: argparse.Namespace) -> None:
    app = _inference_app(args.mode, args.size_mb)
    page = [VLLM_PAGE]

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(request: web.Request) -> web.Response:
        entry: dict[str, object] = {"id": MODEL, "object": "model", "max_model_len": 4096}
        if args.mode == "bool-context":
            entry["max_model_len"] = True
        if args.mode == "list-models":
            return web.json_response([entry])
        return web.json_response({"object": "list", "data": [entry]})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=page[0], content_type="text/plain")

    async def set_metrics(request: web.Request) -> web.Response:
        page[0] = await request.text()
        return web.Response(text="ok")

    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/control/metrics", set_metrics)
    async with served(app) as url:
        print(f"front-fake upstream ready: url={url}", flush=True)
        await until_signalled()


def main() -> None:
    parser = argparse.ArgumentParser(prog="front_fakes")
    kinds = parser.add_subparsers(dest="kind", required=True)
    worker = kinds.add_parser("worker")
    worker.add_argument("--store", required=True)
    worker.add_argument("--mode", default="small")
    worker.add_argument("--id", default="f" * 16)
    worker.add_argument("--context", type=int, default=MockerConfig().context_length)
    worker.add_argument("--block-size", type=int, default=0)
    worker.add_argument("--taint", action="append", default=[])
    worker.add_argument("--size-mb", type=int, default=256)
    upstream = kinds.add_parser("upstream")
    upstream.add_argument("--mode", default="honest")
    upstream.add_argument("--size-mb", type=int, default=256)
    args = parser.parse_args()
    asyncio.run(run_worker(args) if args.kind == "worker" else run_upstream(args))


if __name__ == "__main__":
    main()
