"""KV-aware routing end to end: real ``dynamo-worker`` mockers publish their caches' KV
events, a real ``dynamod`` follows them, and ``dynamoctl route explain`` shows the
overlap each engine really holds and where it came from: blocks stored by requests that
never went through the router, blocks gone after eviction, the index rebuilt by a daemon
restart, and approximate overlap for a worker that publishes no events."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.eventually import eventually
from tests.support.processes import Proc, daemon, dynamoctl, running, worker

pytestmark = pytest.mark.timeout(120)

BLOCK = 4
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliet", "kilo", "lima", "mike")  # fmt: skip


def prompt(seed: int, words: int = 14) -> str:
    """``words`` words (one token each, plus the tokenizer's start token: not a whole
    number of blocks, so every full block can be reused)."""
    return " ".join(WORDS[(seed * 7 + i * (seed + 1)) % len(WORDS)] for i in range(words))


async def complete(http: aiohttp.ClientSession, base: str, text: str) -> dict[str, Any]:
    body = {"model": "llama", "prompt": text, "max_tokens": 2}
    async with http.post(f"{base}/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = await response.json()
        answer["worker"] = response.headers["x-dynamo-worker-id"]
        return answer


async def explain(socket: Path, text: str) -> dict[str, dict[str, Any]]:
    argv = dynamoctl("--endpoint", f"unix://{socket}", "route", "explain", "--model", "llama",
                     "--prompt", text, "-o", "json")  # fmt: skip
    done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return {c["id"]: c for c in json.loads(done.stdout)["candidates"]}


async def explained(
    socket: Path, text: str, check: Callable[[dict[str, dict[str, Any]]], bool]
) -> dict[str, dict[str, Any]]:
    """Explain until ``check`` holds (KV events reach another process's daemon with no
    signal this test can await), for 20 s at most."""

    async def holds() -> dict[str, dict[str, Any]] | None:
        found = await explain(socket, text)
        return found if check(found) else None

    return await eventually(holds, within=20, what="the explanation's check")


def overlap(found: dict[str, dict[str, Any]], worker_id: str) -> tuple[int, str]:
    row = found[worker_id]
    return row["overlap_blocks"], row["overlap_source"]


def mocker(store: str, *args: str) -> Proc:
    return worker(store, "--block-size", str(BLOCK), "--num-kv-blocks", "16", *args)


async def test_overlap_follows_what_each_engine_holds_and_survives_a_daemon_restart(
    tmp_path: Path,
) -> None:
    store = (tmp_path / "store").as_uri()
    socket = tmp_path / "d.sock"
    async with (
        running(mocker(store)) as a,
        running(mocker(store)) as b,
        running(daemon(store, socket)) as front,
        aiohttp.ClientSession() as http,
    ):
        ids = {a.field("id"): a, b.field("id"): b}
        base = front.field("http")
        first = prompt(1)
        served = await complete(http, base, first)
        holder = served["worker"]
        other = next(i for i in ids if i != holder)
        blocks = served["usage"]["prompt_tokens"] // BLOCK
        found = await explained(socket, first, lambda f: overlap(f, holder)[0] == blocks)
        assert overlap(found, holder) == (blocks, "kv")
        assert overlap(found, other) == (0, "kv")
        again = await complete(http, base, first)
        assert again["worker"] == holder
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == blocks * BLOCK

        # Straight to the other worker, past the router: its engine's events tell.
        second = prompt(2)
        await complete(http, ids[other].field("http"), second)
        found = await explained(socket, second, lambda f: overlap(f, other)[0] > 0)
        assert overlap(found, other) == (blocks, "kv")

        # Fill the holder's 16-block cache with other prompts: the first one is evicted.
        for seed in range(3, 9):
            await complete(http, ids[holder].field("http"), prompt(seed))
        found = await explained(socket, first, lambda f: overlap(f, holder)[0] < blocks)
        assert overlap(found, holder)[0] < blocks, "the eviction reached the index"

        held_now = overlap(found, holder)
        await front.stop()
        restarted = daemon(store, socket)
        async with running(restarted):
            rebuilt = await explained(socket, second, lambda f: overlap(f, other)[0] > 0)
            assert overlap(rebuilt, other) == (blocks, "kv")
            assert overlap(await explain(socket, first), holder) == held_now


async def test_a_worker_without_kv_events_keeps_approximate_overlap(tmp_path: Path) -> None:
    store = (tmp_path / "store").as_uri()
    socket = tmp_path / "d.sock"
    async with (
        running(mocker(store, "--kv-events", "off")) as plain,
        running(daemon(store, socket)) as front,
        aiohttp.ClientSession() as http,
    ):
        text = prompt(4)
        before = await explain(socket, text)
        assert overlap(before, plain.field("id")) == (0, "approximate")
        served = await complete(http, front.field("http"), text)
        blocks = served["usage"]["prompt_tokens"] // BLOCK
        after = await explain(socket, text)
        assert overlap(after, plain.field("id")) == (blocks, "approximate")


RESET_TOKENS = """
[[token]]
name = "ops"
secret = "ops-secret"
role = "write"

[[token]]
name = "viewer"
secret = "viewer-secret"
role = "read"
"""


async def test_a_prefix_cache_reset_needs_a_writer_and_empties_the_index(tmp_path: Path) -> None:
    """``POST /engine/reset_prefix_cache`` on the system port: refused without a token
    (401) and with a read-only one (403), changing nothing; with a writer's token the
    engine's cache is emptied, and its ``cleared`` event empties the router's index."""
    store = (tmp_path / "store").as_uri()
    socket = tmp_path / "d.sock"
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(RESET_TOKENS)
    async with (
        running(mocker(store, "--token-file", str(tokens))) as engine,
        running(daemon(store, socket)) as front,
        aiohttp.ClientSession() as http,
    ):
        worker_id = engine.field("id")
        text = prompt(5)
        served = await complete(http, front.field("http"), text)
        blocks = served["usage"]["prompt_tokens"] // BLOCK
        await explained(socket, text, lambda f: overlap(f, worker_id) == (blocks, "kv"))
        url = engine.field("system") + "/engine/reset_prefix_cache"
        for headers, status in (({}, 401), ({"Authorization": "Bearer viewer-secret"}, 403)):
            async with http.post(url, headers=headers) as response:
                assert response.status == status, await response.text()
        again = await complete(http, front.field("http"), text)
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == blocks * BLOCK
        async with http.post(url, headers={"Authorization": "Bearer ops-secret"}) as response:
            assert (response.status, await response.json()) == (200, {"status": "ok"})
        await explained(socket, text, lambda f: overlap(f, worker_id) == (0, "kv"))
