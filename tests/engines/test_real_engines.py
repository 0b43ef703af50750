"""Real engines in a real fleet: two ``dynamo-worker --engine vllm`` processes and one
``--engine openai`` worker that launches a real ``vllm serve``, all on the tiny model,
behind a real ``dynamod``, driven through the official ``openai`` client.

One fleet serves the whole module (engines take tens of seconds to start); the tests run
in file order and the last two stop parts of it on purpose.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import psutil
import pytest
import pytest_asyncio

from tests.engines.conftest import ENGINE_ENV, LEASE_TTL, READY_WITHIN, serve_argv, vllm_worker
from tests.support.eventually import eventually
from tests.support.processes import BIN, ROOT, Proc, daemon, dynamoctl
from tests.support.servers import free_port

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(900)]

MODEL = "tiny"
WORKER_ID = "x-dynamo-worker-id"
LONG_PROMPT = (
    "the quick brown fox jumps over the lazy dog and the river runs north under the old "
    "stone bridge while the router sends each request to a worker with a cache block "
    "token prefix engine server client stream prompt reply chat system user assistant"
)


@dataclass
class Fleet:
    front: str
    socket: Path
    daemon: Proc
    fast: Proc  # vllm, capacity/fast pool=a
    slow: Proc  # vllm, capacity/slow pool=b
    sidecar: Proc  # openai, pool=serve, launched vllm serve

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.front}/v1", api_key="none", max_retries=0)

    async def workers(self) -> list[dict[str, Any]]:
        argv = dynamoctl("--endpoint", f"unix://{self.socket}", "workers", "ls", "-o", "json")
        done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        listed: list[dict[str, Any]] = json.loads(done.stdout)
        return listed

    async def until(self, proc: Proc, check: Any, within: float = 60.0) -> dict[str, Any]:
        """The worker's listing once ``check(listing)`` holds (a deadline, no fixed sleep).
        A worker missing from a listing (its record between a lapsed lease and its
        re-registration, on a starved machine) is not there yet."""

        async def holds() -> dict[str, Any] | None:
            found = [w for w in await self.workers() if w["id"] == proc.field("id")]
            return found[0] if found and check(found[0]) else None

        return await eventually(holds, within=within, every=0.2, what=proc.field("id"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(
    engines_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    root = tmp_path_factory.mktemp("fleet")
    store = (root / "store").as_uri()
    socket = root / "dynamod.sock"
    port = free_port()
    sidecar_argv = [
        str(BIN / "dynamo-worker"), "--engine", "openai", "--model", MODEL,
        "--upstream", f"http://127.0.0.1:{port}", "--store", store, "--lease-ttl", LEASE_TTL,
        "--taint", "pool=serve", "--launch", "--", *serve_argv(engines_python, tiny_model, port),
    ]  # fmt: skip
    procs = {
        "daemon": daemon(store, socket),
        "fast": vllm_worker(
            engines_python, tiny_model, store, "--taint", "capacity/fast", "--taint", "pool=a"
        ),
        "slow": vllm_worker(
            engines_python,
            tiny_model,
            store,
            "--taint",
            "capacity/slow",
            "--taint",
            "pool=b",
            "--grace",
            "120",
        ),
        "sidecar": Proc(sidecar_argv, r"^dynamo-worker ready:", ENGINE_ENV, group=True),
    }
    try:
        await asyncio.gather(*(p.start(within=READY_WITHIN) for p in procs.values()))
        fleet = Fleet(procs["daemon"].field("http"), socket, **procs)
        for proc in (fleet.fast, fleet.slow, fleet.sidecar):  # registered and reporting
            await fleet.until(proc, lambda w: w["engine"] is not None)
        yield fleet
    finally:
        await asyncio.gather(*(p.close() for p in procs.values()))
        gc.collect()  # their transports, while the module's loop still runs


def constraints(
    required: list[str] | None = None, preferred: dict[str, float] | None = None
) -> dict[str, Any]:
    rc: dict[str, Any] = {"required_taints": required or []}
    if preferred:
        rc["preferred_taints"] = preferred
    return {"nvext": {"routing_constraints": rc}}


async def complete(
    fleet: Fleet, prompt: str, *, max_tokens: int = 4, **extra: Any
) -> tuple[str, Any]:
    async with fleet.client() as client:
        raw = await client.completions.with_raw_response.create(
            model=MODEL, prompt=prompt, max_tokens=max_tokens, extra_body=extra or None
        )
    return raw.headers[WORKER_ID], raw.parse()


async def test_completions_and_chat_stream_and_not_through_dynamod(fleet: Fleet) -> None:
    fast = fleet.fast.field("id")
    served, reply = await complete(fleet, "hello world", **constraints(["capacity/fast"]))
    assert served == fast and reply.usage is not None
    assert reply.choices[0].finish_reason in ("length", "stop")
    assert reply.usage.prompt_tokens == 3  # <s> hello world, as the model's tokenizer has it
    async with fleet.client() as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hello there"}],
            max_tokens=4,
            extra_body=constraints(["capacity/fast"]),
        )
        chat = raw.parse()
        assert raw.headers[WORKER_ID] == fast and chat.choices[0].message.role == "assistant"
        # The front rendered and tokenized the chat (the worker took its ids); vllm serve
        # does both itself: the same count.
        served_itself = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hello there"}],
            max_tokens=4,
            extra_body=constraints(["pool=serve"]),
        )
        assert chat.usage is not None and served_itself.usage is not None
        assert chat.usage.prompt_tokens == served_itself.usage.prompt_tokens
        stream = await client.completions.create(
            model=MODEL, prompt="hello", max_tokens=6, stream=True,
            stream_options={"include_usage": True}, extra_body=constraints(["pool=serve"]),
        )  # fmt: skip
        chunks = [c async for c in stream]
        chat_stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=6,
            stream=True, extra_body=constraints(["capacity/slow"]),
        )  # fmt: skip
        chat_chunks = [c async for c in chat_stream]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)
    assert chat_chunks[-1].choices[0].finish_reason in ("length", "stop")


async def test_required_and_preferred_taints_choose_the_worker(fleet: Fleet) -> None:
    ids = {p.field("id"): name for name, p in (("fast", fleet.fast), ("slow", fleet.slow),
                                               ("sidecar", fleet.sidecar))}  # fmt: skip
    for required, expected in (("capacity/slow", "slow"), ("pool=serve", "sidecar")):
        served, _ = await complete(fleet, f"{uuid.uuid4().hex} x", **constraints([required]))
        assert ids[served] == expected
    for preferred, expected in (("pool=a", "fast"), ("pool=b", "slow")):
        body = constraints(preferred={preferred: 1.0})
        served, _ = await complete(fleet, f"{uuid.uuid4().hex} y", **body)
        assert ids[served] == expected, f"preferred {preferred} went to {ids[served]}"


async def test_a_taint_change_moves_traffic(fleet: Fleet) -> None:
    moved = constraints(["pool=moved"])
    async with fleet.client() as client:
        with pytest.raises(openai.APIStatusError) as refused:
            await client.completions.create(model=MODEL, prompt="x", max_tokens=1, extra_body=moved)
    assert refused.value.status_code == 503
    system = fleet.slow.field("system")
    async with aiohttp.ClientSession() as http:
        url = f"{system}/engine/update/model_taints"
        async with http.post(url, json={"taints": ["capacity/slow", "pool=moved"]}) as r:
            assert r.status == 200
        await fleet.until(fleet.slow, lambda w: "pool=moved" in w["taints"])
        served, _ = await complete(fleet, "moving along", **moved)
        assert served == fleet.slow.field("id")
        async with http.post(url, json={"taints": ["capacity/slow", "pool=b"]}) as r:
            assert r.status == 200


@pytest.mark.parametrize("required", ["capacity/fast", "pool=serve"])
async def test_a_repeated_prompt_is_served_from_the_prefix_cache(
    fleet: Fleet, required: str
) -> None:
    prompt = f"{uuid.uuid4().hex} {LONG_PROMPT}"
    first_worker, first = await complete(fleet, prompt, **constraints([required]))
    second_worker, second = await complete(fleet, prompt, **constraints([required]))
    assert first_worker == second_worker
    assert first.usage.prompt_tokens > 32
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    assert second.usage.prompt_tokens_details.cached_tokens % 32 == 0  # whole blocks only


async def explain_overlap(fleet: Fleet, prompt: str, worker: str) -> tuple[int, str]:
    """The router's overlap for ``worker`` and where it came from (``route explain``)."""
    argv = dynamoctl("--endpoint", f"unix://{fleet.socket}", "route", "explain", "--model",
                     MODEL, "--prompt", prompt, "-o", "json")  # fmt: skip
    done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    row = next(c for c in json.loads(done.stdout)["candidates"] if c["id"] == worker)
    return row["overlap_blocks"], row["overlap_source"]


async def test_the_routers_overlap_is_the_blocks_vllm_stored(fleet: Fleet) -> None:
    """vLLM's own KV events, through the worker's events stream, give the router exactly
    the blocks the engine then serves from its cache (its ``cached_tokens``)."""
    prompt = f"{uuid.uuid4().hex} {LONG_PROMPT}"
    fast = constraints(["capacity/fast"])
    worker, first = await complete(fleet, prompt, **fast)
    assert worker == fleet.fast.field("id") and first.usage.prompt_tokens > 64
    again, second = await complete(fleet, prompt, **fast)
    assert again == worker
    stored = first.usage.prompt_tokens // 32  # the prompt's whole blocks
    # vLLM computes at least the prompt's last token: a prompt of whole blocks is served
    # with its last block recomputed.
    served = stored - (first.usage.prompt_tokens % 32 == 0)
    assert second.usage.prompt_tokens_details.cached_tokens == served * 32
    deadline = time.monotonic() + 30  # events reach the daemon with no signal to await
    while (found := await explain_overlap(fleet, prompt, worker)) != (stored, "kv"):
        assert time.monotonic() < deadline, f"overlap {found}; vLLM stored {stored} blocks"
        await asyncio.sleep(0.2)
    slow = await explain_overlap(fleet, prompt, fleet.slow.field("id"))
    assert slow == (0, "kv"), "the other vLLM worker never saw this prompt"


async def test_engine_load_shows_in_dynamoctl_workers_ls(fleet: Fleet) -> None:
    """Requests sent to each worker directly (no router holds them back), one worker at a
    time and renewed until the listing has shown them: two engines generating at once,
    beside a third, starve two cores enough to stall a scrape past its timeout."""
    body = {"model": MODEL, "prompt": "load", "max_tokens": 900, "ignore_eos": True}

    def busy(w: dict[str, Any]) -> bool:
        engine = w["engine"]  # None while the daemon's feed of the worker reconnects
        return engine is not None and engine["running"] + engine["waiting"] > 0

    def idle(w: dict[str, Any]) -> bool:
        engine = w["engine"]
        return engine is not None and engine["running"] == 0 and engine["healthy"]

    async with aiohttp.ClientSession() as http:
        for proc, source in ((fleet.fast, "engine"), (fleet.sidecar, "metrics")):
            shown = asyncio.Event()

            async def hammer(proc: Proc = proc, shown: asyncio.Event = shown) -> None:
                while not shown.is_set():
                    url = f"{proc.field('http')}/v1/completions"
                    async with http.post(url, json=body) as response:
                        assert response.status == 200, await response.text()

            async with asyncio.TaskGroup() as group:
                for _ in range(4):
                    group.create_task(hammer())
                seen = (await fleet.until(proc, busy, within=120))["engine"]
                shown.set()
            assert seen["source"] == source
            assert (await fleet.until(proc, idle, within=120))["engine"]["kv_blocks_total"] > 0


async def test_sigterm_mid_stream_finishes_the_stream_and_exits_0(fleet: Fleet) -> None:
    async with fleet.client() as client:
        stream = await client.completions.create(
            model=MODEL, prompt="a long story", max_tokens=900, stream=True,
            extra_body={**constraints(["capacity/slow"]), "ignore_eos": True},
        )  # fmt: skip
        chunks = []
        async for chunk in stream:
            chunks.append(chunk)
            if len(chunks) == 2:
                fleet.slow.send(signal.SIGTERM)
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    assert await fleet.slow.wait(within=120) == 0
    gone = await fleet.until(fleet.fast, lambda w: True)
    assert gone and fleet.slow.field("id") not in [w["id"] for w in await fleet.workers()]


async def test_a_killed_upstream_leaves_the_routable_set(fleet: Fleet) -> None:
    sidecar = psutil.Process(fleet.sidecar.pid)
    (server,) = sidecar.children()
    os.killpg(server.pid, signal.SIGKILL)
    down = await fleet.until(fleet.sidecar, lambda w: not w["engine"]["healthy"])
    assert "not answering" in down["engine"]["reason"]
    async with fleet.client() as client:
        with pytest.raises(openai.APIStatusError) as waited:
            await client.completions.create(
                model=MODEL, prompt="x", max_tokens=1,
                extra_body={"nvext": {**constraints(["pool=serve"])["nvext"], "max_wait": 0.5}},
            )  # fmt: skip
    assert waited.value.status_code == 503 and "unhealthy" in str(waited.value)
    for _ in range(5):
        served, _ = await complete(fleet, f"{uuid.uuid4().hex} z")
        assert served == fleet.fast.field("id")


async def test_the_front_tokenizes_exactly_as_transformers(
    engines_python: Path, tiny_model: Path
) -> None:
    """The tokenizer the daemon builds from the files a vLLM worker publishes gives the ids
    transformers (and so vLLM) gives, for text and for the chat template."""
    texts = ["hello world", "Hello, world! ünïcödé 🙂", LONG_PROMPT]
    check = ROOT / "tests" / "engines" / "tokenizer_check.py"
    done = await asyncio.to_thread(
        subprocess.run,
        [str(engines_python), str(check), str(tiny_model), *texts],
        capture_output=True, text=True, timeout=120, env={**os.environ, **ENGINE_ENV},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    verdicts = json.loads(done.stdout.splitlines()[-1])
    assert verdicts == {"texts": [True, True, True], "render": True, "chat": True}
