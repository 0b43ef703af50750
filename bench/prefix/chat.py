"""The multi-turn chat workload of ``bench/prefix/run.py``, its client, and what it measures.

**Workload** (``Chat``): ``sessions`` conversations of ``turns`` turns, run by
``concurrency`` clients at once (each takes a conversation and plays its turns one after
the other, then takes the next). Turn ``t`` sends the whole history (every earlier user
message and the assistant's reply to it) plus a new user message of ``user_words`` words,
as one ``/v1/completions`` prompt rendered by the client; the assistant's reply in the
history is fixed text from the workload (``reply_words`` words), not the model's output,
so every stack and every routing sees the very same prompts. Words come from the
mocker's vocabulary, seeded per (round, variant): a variant never finds blocks a
previous one left in the caches.

**Measured per request** (streamed, ``stream_options.include_usage``): prompt tokens,
``usage.prompt_tokens_details.cached_tokens`` (the engine's own count of prompt tokens
served from its prefix cache: ground truth, in whole blocks), time to the first event
that carries a choice, and the worker that served it (``x-dynamo-worker-id``, or Dynamo's
``nvext.worker_id``).
**Summarized** (``summary``): hit rate = cached ÷ prompt tokens, TTFT p50 / p99,
stickiness (share of turns after the first served by the worker of the session's
previous turn) and balance (busiest worker's requests ÷ the mean).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from bench.common import percentile
from dynamod.tokenizers.simple import VOCABULARY

Pick = Callable[[], str]
"""Where the next request goes: a base URL (the front, or a worker picked at random)."""


@dataclass(frozen=True)
class Chat:
    sessions: int = 12
    turns: int = 6
    concurrency: int = 6
    user_words: int = 40
    reply_words: int = 24
    max_tokens: int = 8

    @staticmethod
    def words() -> list[str]:
        """The words prompts are made of (besides ``user:`` and ``assistant:``)."""
        return [w for w in VOCABULARY if w.isalpha()]

    def conversations(self, seed: int) -> list[list[str]]:
        """Each session's prompts, turn by turn."""
        rng = random.Random(seed)
        words = self.words()
        out = []
        for _ in range(self.sessions):
            history: list[str] = []
            prompts = []
            for _ in range(self.turns):
                history += ["user:", *rng.choices(words, k=self.user_words)]
                prompts.append(" ".join(history))
                history += ["assistant:", *rng.choices(words, k=self.reply_words)]
            out.append(prompts)
        return out


@dataclass
class Served:
    session: tuple[int, int]  # (the workload's seed, the session's index): unique across runs
    turn: int
    prompt_tokens: int
    cached_tokens: int
    ttft: float
    worker: str


@dataclass
class Run:
    """One variant's pass over the workload."""

    stack: str
    variant: str
    served: list[Served] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        prompt = sum(s.prompt_tokens for s in self.served)
        cached = sum(s.cached_tokens for s in self.served)
        ttfts = [s.ttft * 1000 for s in self.served]
        by_worker = Counter(s.worker for s in self.served if s.worker)
        return {
            "stack": self.stack,
            "variant": self.variant,
            "requests": len(self.served),
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "hit_rate": cached / prompt if prompt else 0.0,
            "ttft_p50_ms": _pct(ttfts, 0.50),
            "ttft_p99_ms": _pct(ttfts, 0.99),
            "stickiness": _stickiness(self.served),
            "balance": (max(by_worker.values()) / (sum(by_worker.values()) / len(by_worker)))
            if by_worker
            else None,
            "seconds": self.seconds,
        }

    def rows(self) -> list[dict[str, Any]]:
        return [asdict(s) for s in self.served]


def _pct(values: Sequence[float], q: float) -> float | None:
    return percentile(sorted(values), q) if values else None  # type: ignore[arg-type]


def _stickiness(served: Sequence[Served]) -> float | None:
    if not all(s.worker for s in served):
        return None
    by_session: dict[tuple[int, int], list[Served]] = {}
    for s in sorted(served, key=lambda s: (s.session, s.turn)):
        by_session.setdefault(s.session, []).append(s)
    pairs = [pair for turns in by_session.values() for pair in itertools.pairwise(turns)]
    return sum(a.worker == b.worker for a, b in pairs) / len(pairs) if pairs else None


async def play(
    http: aiohttp.ClientSession,
    chat: Chat,
    seed: int,
    pick: Pick,
    model: str,
    run: Run,
    extra: dict[str, Any] | None = None,
) -> Run:
    """Play the whole workload once through ``pick``; every request's measures in ``run``."""
    queue = list(enumerate(chat.conversations(seed)))
    queue.reverse()

    async def client() -> None:
        while queue:
            session, prompts = queue.pop()
            for turn, prompt in enumerate(prompts):
                run.served.append(
                    await request(
                        http, pick(), model, prompt, chat.max_tokens, (seed, session), turn, extra
                    )
                )

    started = time.perf_counter()
    await gather(client() for _ in range(chat.concurrency))
    run.seconds = time.perf_counter() - started
    return run


async def gather(coros: Any) -> None:
    async with asyncio.TaskGroup() as group:
        for coro in coros:
            group.create_task(coro)


async def request(
    http: aiohttp.ClientSession,
    base: str,
    model: str,
    prompt: str,
    max_tokens: int,
    session: tuple[int, int],
    turn: int,
    extra: dict[str, Any] | None,
) -> Served:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **(extra or {}),
    }
    started = time.perf_counter()
    first: float | None = None
    usage: dict[str, Any] = {}
    async with http.post(f"{base}/v1/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{base} answered {response.status}: {await response.text()}")
        worker = response.headers.get("x-dynamo-worker-id", "")
        async for line in response.content:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("choices") and first is None:
                first = time.perf_counter() - started
            worker = _nvext_worker(event) or worker
            usage = event.get("usage") or usage
    details = usage.get("prompt_tokens_details") or {}
    return Served(
        session,
        turn,
        int(usage.get("prompt_tokens", 0)),
        int(details.get("cached_tokens") or 0),
        first if first is not None else time.perf_counter() - started,
        worker,
    )


def _nvext_worker(event: dict[str, Any]) -> str | None:
    """The worker Dynamo's frontend names in a chunk, when asked to (``nvext``)."""
    found = ((event.get("nvext") or {}).get("worker_id") or {}).get("decode_worker_id")
    return None if found is None else str(found)


async def until(probe: Callable[[], Awaitable[bool]], what: str, within: float = 300.0) -> None:
    """Wait for a process that announces nothing (a front that sees its workers)."""
    deadline = time.monotonic() + within
    while not await probe():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {within:g} s waiting for {what}")
        await asyncio.sleep(0.2)
