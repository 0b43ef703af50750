"""A hostile worker process whose tokenizers are weapons: ``python -m
tests.hostile_workers.template_fakes STORE_URL``.

It registers one worker record per model of ``MODELS`` in the store, as a worker does (a
lease kept alive), each naming a Hugging Face tokenizer bundle on its system port
(``/engine/tokenizer/<model>``). The bundles are real: a tiny ``tokenizer.json`` built here
with the ``tokenizers`` library, and a chat template that is a CPU bomb, a memory bomb, or
raises; or a ``tokenizer.json`` whose pre-tokenizer backtracks for ages in Rust
(``tpl-regex``) or panics (``tpl-panic``); or the bundle itself is the weapon
(``tpl-endless``: a body that never ends). Its inference port answers any chat with one
completion whose text is the prompt's token ids as the daemon forwarded them, for the
requests that get past the daemon's front. ``GET /fetches/<model>`` on the system port
says how many times that bundle was asked for. When ready it prints
``template fakes ready: system=URL``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import sys
from collections import Counter

from aiohttp import web
from tokenizers import Regex, Tokenizer, models, pre_tokenizers

from dynamod import jsoncodec
from dynamod.discovery.registration import Registration
from dynamod.records import ModelCard, WorkerRecord
from dynamod.store import open_store
from dynamod.tokenizers.base import bundle_checksum
from tests.support.factories import make_record
from tests.support.web import served

WORDS = ["hello", "there", "a", "chat", "user", "assistant", "<s>", "</s>"]
FINE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}assistant"
)
TEMPLATES = {
    "tpl-fine": FINE,
    "tpl-cpu": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}"
    ),
    "tpl-memory": "{{ 'x' * 500000000 }}",
    "tpl-doubling": (
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}{{ ns.s | length }}"
    ),
    "tpl-overflow": "{{ range(10 ** 30) }}",
    "tpl-recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "tpl-type": "{{ messages[0]['content'] + 1 }}",
    "tpl-refuses": "{{ raise_exception('roles must alternate user/assistant') }}",
}
SPLITS = {
    # Backtracks on every run of a's without a b: seconds of CPU per few KB, all in Rust.
    "tpl-regex": r"(a|aa)+b",
    # Past Oniguruma's retry limit at once: the tokenizer panics (pyo3's PanicException).
    "tpl-panic": r"(\w+\s?)*$",
}
ENDLESS = "tpl-endless"
MODELS = (*TEMPLATES, *SPLITS, ENDLESS)
CHUNK = b" " * (1 << 20)


def tokenizer_json(split: str | None = None) -> str:
    """A tiny word-level ``tokenizer.json``: a handful of words, the rest unknown; split
    on whitespace, or by the regular expression ``split``."""
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = (
        pre_tokenizers.WhitespaceSplit()
        if split is None
        else pre_tokenizers.Split(Regex(split), behavior="isolated")
    )
    return str(tokenizer.to_str())


def bundle(template: str, split: str | None = None) -> bytes:
    """A Hugging Face bundle (canonical JSON, as a worker serves it) with ``template``."""
    config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": template}
    files = {"tokenizer.json": tokenizer_json(split), "tokenizer_config.json": json.dumps(config)}
    return jsoncodec.canonical({"kind": "hf", "files": files})


class Fakes:
    """The system and inference routes of the hostile worker."""

    def __init__(self) -> None:
        self.bundles = {model: bundle(template) for model, template in TEMPLATES.items()}
        self.bundles |= {model: bundle(FINE, split) for model, split in SPLITS.items()}
        self.fetches: Counter[str] = Counter()

    def checksum(self, model: str) -> str:
        if model == ENDLESS:
            return "sha256:" + "0" * 64
        return bundle_checksum(json.loads(self.bundles[model]))

    async def tokenizer(self, request: web.Request) -> web.StreamResponse:
        model = request.match_info["model"]
        self.fetches[model] += 1
        if model != ENDLESS:
            return web.Response(body=self.bundles[model], content_type="application/json")
        response = web.StreamResponse()  # chunked, no length announced: it never ends
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):  # until the daemon hangs up
            while True:
                await response.write(CHUNK)
        return response

    async def count(self, request: web.Request) -> web.Response:
        return web.json_response(self.fetches[request.match_info["model"]])

    async def chat(self, request: web.Request) -> web.Response:
        """One fixed answer, whose text is the prompt's token ids as the daemon sent them."""
        body = await request.json()
        ids = body.get("nvext", {}).get("token_ids")
        message = {"role": "assistant", "content": json.dumps(ids)}
        return web.json_response(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )


async def main(store_url: str) -> None:
    fakes = Fakes()
    system, inference = web.Application(), web.Application()
    system.router.add_get("/engine/tokenizer/{model}", fakes.tokenizer)
    system.router.add_get("/fetches/{model}", fakes.count)
    inference.router.add_post("/v1/chat/completions", fakes.chat)
    async with contextlib.AsyncExitStack() as stack:
        system_url = await stack.enter_async_context(served(system))
        inference_url = await stack.enter_async_context(served(inference))
        store = await open_store(store_url)
        stack.push_async_callback(store.aclose)
        for model in MODELS:
            worker = record(model, fakes.checksum(model), system_url, inference_url)
            await stack.enter_async_context(Registration(store, worker, ttl=2))
        print(f"template fakes ready: system={system_url}", flush=True)
        await asyncio.Event().wait()


def record(model: str, checksum: str, system_url: str, inference_url: str) -> WorkerRecord:
    ref = {"kind": "hf", "path": f"/engine/tokenizer/{model}", "checksum": checksum}
    return dataclasses.replace(
        make_record(model=model, address=inference_url),
        system_address=system_url,
        model_card=ModelCard(name=model, extra={"tokenizer": ref}),
        pid=os.getpid(),
    )


if __name__ == "__main__":
    try:
        asyncio.run(main(sys.argv[1]))
    except KeyboardInterrupt:
        pass
