"""The engine contract: what the worker runtime and the inference routes need from an engine.

An engine (the mocker now, a vLLM adapter later) turns prompt token ids into generated
tokens. Its contract:

* **Lifetime.** An engine is an async context manager. ``__aenter__`` starts whatever
  background tasks it owns (a scheduler loop); ``__aexit__`` cancels and awaits every one
  of them, and every ``generate`` stream still open then fails with ``ShuttingDownError``
  at its next chunk. Nothing the engine started outlives ``__aexit__``.
* **generate(request)** validates at once, *when called*: a request the engine can never
  serve (prompt longer than the context, more KV blocks than the cache holds, bad
  ``max_tokens``) raises ``InvalidInputError`` before any iteration, so an HTTP front can
  answer 400 before it starts a stream. The returned async generator submits the request
  on its first ``__anext__`` and yields at least one ``Chunk``; the last one has
  ``finish_reason`` set and the final ``usage``; nothing follows it.
* **Cancellation.** A consumer that stops early must either close the generator
  (``contextlib.aclosing``) or be cancelled while awaiting it. Either way the engine frees
  that request's resources (scheduler slot, KV blocks) before the close / cancellation
  completes. Dropping an open generator without closing it leaves cleanup to the garbage
  collector: a bug in the consumer.
* ``stats()`` and ``model_card()`` are cheap, synchronous and never fail. Whenever what
  ``stats()`` would say changes, the engine calls ``changes.changed()`` (from the event
  loop's thread), so the worker can push it to routers instead of polling.
* ``tokenizer`` is the model's own and publishable (``tokenizers/bundle.py``): the worker
  serves it to daemons, whose front then tokenizes exactly as the engine does.
* ``kv_events`` is the engine's KV cache events (``kvevents.py``), or None when it
  publishes none: the worker forwards them to daemons and its record offers ``"kv"``.
  ``reset_prefix_cache()`` empties the engine's prefix cache; False when it could not
  (requests hold blocks, or an upstream refused), and then nothing changed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, Protocol, Self

from dynamod.records import ModelCard
from dynamod.tokenizers.bundle import Publishable
from dynamod.worker.engines.kvevents import KvPublisher

FinishReason = Literal["stop", "length"]


class Changes:
    """Counts an engine's state changes, and lets a reader wait for the next one.

    ``changed()`` is cheap and synchronous (an engine calls it on every step);
    ``await wait_past(version)`` returns once ``version`` is behind. Event-loop thread only.
    """

    def __init__(self) -> None:
        self.version = 0
        self._next = asyncio.Event()

    def changed(self) -> None:
        self.version += 1
        self._next.set()
        self._next = asyncio.Event()

    async def wait_past(self, version: int) -> None:
        while self.version <= version:
            await self._next.wait()


@dataclass(frozen=True)
class GenerateRequest:
    """One generation.

    ``max_tokens`` None lets the engine stop on its own (end of sequence, finish reason
    ``"stop"``); a number caps the output (finish reason ``"length"`` when reached).
    ``seed`` makes sampling reproducible; ``temperature`` and ``top_p`` (None: the
    engine's defaults) shape it, for an engine that samples from a model (the mocker
    draws its tokens from ``seed`` alone); ``ignore_eos`` keeps a model generating past its
    end-of-sequence token up to ``max_tokens`` (vLLM's extension; the mocker has no such
    token); ``request_id`` names the request in logs.
    """

    request_id: str
    prompt_ids: tuple[int, ...]
    max_tokens: int | None = None
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    ignore_eos: bool = False


@dataclass(frozen=True)
class Usage:
    """Token accounting. ``cached_tokens``: prompt tokens served from the prefix cache."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Timing:
    """Engine time spent on one request so far: seconds of steps that prefilled it, and of
    steps that decoded it. The mocker reports the simulated seconds it charged."""

    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0


@dataclass(frozen=True)
class Chunk:
    """New output of one request: the text and the ids of the tokens since the last chunk.

    ``finish_reason`` is set on the last chunk only. ``usage`` and ``timing`` are running
    totals, final on the last chunk.
    """

    text: str
    token_ids: tuple[int, ...]
    usage: Usage
    timing: Timing = Timing()
    finish_reason: FinishReason | None = None


@dataclass(frozen=True)
class EngineStats:
    """A load snapshot. ``prefix_cache_hits`` / ``prefix_cache_queries`` count what the
    engine looked up in and found in its prefix cache since it started (the mocker counts
    blocks, vLLM tokens). ``healthy`` false (with ``reason``) when the engine cannot serve
    now: an upstream server that stopped answering. ``source``: where the figures come from
    (``reported.EngineLoad.source``)."""

    active_requests: int
    waiting_requests: int
    kv_blocks_used: int
    kv_blocks_total: int
    prefix_cache_hits: int = 0
    prefix_cache_queries: int = 0
    healthy: bool = True
    reason: str = ""
    source: str = "engine"


class WorkerEngine(Protocol):
    """The engine a worker serves its model with, as the worker runtime needs it: the card,
    the load, the tokenizer, a lifetime. An ``Engine`` generates in this process;
    ``--engine openai``'s ``UpstreamEngine`` (``upstream.py``) forwards to a server beside
    the worker."""

    @property
    def tokenizer(self) -> Publishable: ...

    @property
    def changes(self) -> Changes: ...

    @property
    def kv_events(self) -> KvPublisher | None: ...

    async def reset_prefix_cache(self) -> bool: ...

    def model_card(self) -> ModelCard: ...

    def stats(self) -> EngineStats: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class Engine(WorkerEngine, Protocol):
    """An inference engine; see the module docstring for the whole contract."""

    def generate(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]: ...
