"""What it costs a small chat request that a model's own chat template and tokenizer run in
a prompt process (``dynamod/prompts``) instead of on the daemon's event loop.

    python -m bench.template_cost                  # 2000 requests per case
    python -m bench.template_cost --requests 500 --json out.json

A model's chat template and ``tokenizer.json`` are code its worker sent: since issue 21
the daemon renders and tokenizes them only in its prompt processes, bounded
(``tokenizers/limits.py``), whatever the body's size. This measures one small chat request
(a system and a user turn, ~300 bytes) read as the front reads it (``read_prompt``: parse,
check, render, tokenize, hash the blocks), one request at a time, in this process:

* ``before: on the loop``: the model's tokenizer built here and called on the loop, as the
  daemon did for small bodies before (every millisecond of it a stall of the loop);
* ``after: prompt process``: the same request through a warm ``PromptProcesses`` process
  holding the model's bundle (``BundledTokenizer``), within its CPU budget;
* ``floor: process round trip``: a job that tokenizes nothing (``read_head``) through the
  same process: the pipe and pickle cost no offload can go below;
* ``mocker: on the loop``: the mocker's ``SimpleTokenizer``, which stays on the loop.

``loop CPU`` is the main thread's CPU time per request (``time.thread_time``): what the
event loop itself spends, which no other request can use. The tokenizer is a synthetic
byte-level BPE the size of Llama 3's (128k tokens; ``--vocab``) with Llama 3's chat
template, built here offline.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import platform
import random
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
from tokenizers import pre_tokenizers

from bench.common import Stats, interruptible, ms, render_table, stats_json, write_json
from dynamod import jsoncodec
from dynamod.http.openai import CHAT, json_object
from dynamod.prompts.body import CardLimits, read_prompt
from dynamod.prompts.processes import PromptProcesses
from dynamod.tokenizers import SimpleTokenizer, Tokenizer
from dynamod.tokenizers.bundle import BundledTokenizer, load
from dynamod.tokenizers.hf import bundle_of

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + "
    "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
MODEL = CardLimits(block_size=16, context_length=8192, checked=True, name="bench")
BODY = orjson.dumps(
    {
        "model": "bench",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
            {
                "role": "user",
                "content": "What is the capital of France, and what river runs through it? "
                "Give one sentence about its history and one about its museums.",
            },
        ],
        "max_tokens": 16,
    }
)
Case = Callable[[], Awaitable[Any]]


def synthetic_bundle(vocab: int) -> bytes:
    """A byte-level BPE ``tokenizer.json`` of ``vocab`` tokens (random merges of short
    pieces) and Llama 3's chat template, as the canonical bundle a worker serves."""
    rng = random.Random(1)
    tokens = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    short, merges = list(tokens), []
    while len(tokens) < vocab:
        a, b = rng.choice(short), rng.choice(short)
        if a + b not in tokens:
            tokens[a + b] = len(tokens)
            merges.append([a, b])
            if len(a + b) < 7:
                short.append(a + b)
    specials = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    added = [_added(len(tokens) + i, text) for i, text in enumerate(specials)]
    byte_level = {
        "type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True,
    }  # fmt: skip
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None,
            "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
            "byte_fallback": False, "ignore_merges": False, "vocab": tokens, "merges": merges,
        },
    }  # fmt: skip
    config = {"bos_token": specials[0], "eos_token": specials[3], "chat_template": LLAMA3_TEMPLATE}
    files = {"tokenizer.json": json.dumps(tokenizer), "tokenizer_config.json": json.dumps(config)}
    return jsoncodec.canonical(bundle_of(files))


def _added(token_id: int, text: str) -> dict[str, Any]:
    return {
        "id": token_id, "content": text, "single_word": False, "lstrip": False,
        "rstrip": False, "normalized": False, "special": True,
    }  # fmt: skip


async def sample(case: Case, requests: int) -> tuple[Stats, Stats]:
    """Latency and loop CPU of ``requests`` calls of ``case``, one at a time."""
    for _ in range(min(50, requests)):  # warm: the process started, the bundle sent
        await case()
    wall, cpu = [], []
    for _ in range(requests):
        started, started_cpu = time.perf_counter_ns(), time.thread_time_ns()
        await case()
        wall.append(time.perf_counter_ns() - started)
        cpu.append(time.thread_time_ns() - started_cpu)
    return Stats.of(wall), Stats.of(cpu)


async def measure(requests: int, vocab: int) -> dict[str, tuple[Stats, Stats]]:
    raw = synthetic_bundle(vocab)
    checksum = "sha256:" + hashlib.sha256(raw).hexdigest()
    here: Tokenizer = load(raw, checksum)
    bundled = BundledTokenizer("hf", checksum, raw)
    simple = SimpleTokenizer()

    async def on_loop(tokenizer: Tokenizer) -> Any:
        return read_prompt(json_object(BODY), BODY, CHAT, tokenizer, MODEL)

    results: dict[str, tuple[Stats, Stats]] = {}
    async with PromptProcesses(1) as workers:
        cases: dict[str, Case] = {
            "before: on the loop": lambda: on_loop(here),
            "after: prompt process": lambda: workers.read_prompt(BODY, CHAT, bundled, MODEL),
            "floor: process round trip": lambda: workers.read_head(BODY),
            "mocker: on the loop": lambda: on_loop(simple),
        }
        for name, case in cases.items():
            results[name] = await sample(case, requests)
            print(f"  {name}: done", file=sys.stderr)
    return results


def table(results: dict[str, tuple[Stats, Stats]]) -> str:
    floor = results["floor: process round trip"][0]
    rows = [
        [
            name,
            ms(wall.p50_ms),
            ms(wall.p99_ms),
            ms(cpu.p50_ms),
            f"{wall.p50_ms - floor.p50_ms:+.3f}",
        ]
        for name, (wall, cpu) in results.items()
    ]
    headers = ["case", "p50 ms", "p99 ms", "loop CPU p50 ms", "p50 vs floor ms"]
    return render_table(headers, rows)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per case")
    parser.add_argument("--vocab", type=int, default=128_000, help="tokens of the tokenizer")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    print(
        f"template cost: {args.requests} small chat requests per case, one at a time; "
        f"Python {platform.python_version()}, {platform.machine()}",
        file=sys.stderr,
    )
    results = asyncio.run(measure(args.requests, args.vocab))
    print(table(results))
    document = {
        name: {"latency": stats_json(wall), "loop_cpu": stats_json(cpu)}
        for name, (wall, cpu) in results.items()
    }
    write_json(args.json, {"requests": args.requests, "vocab": args.vocab, "cases": document})
    return 0


if __name__ == "__main__":
    sys.exit(interruptible(main))
