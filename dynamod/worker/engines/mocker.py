"""The mocker: a simulated inference engine, realistic enough to exercise a router.

No model runs. What is simulated is what a router can observe of a vLLM-style engine:

* a **paged KV cache** (``KvCache``) of ``num_kv_blocks`` blocks of ``block_size`` tokens,
  with **prefix caching**: full prompt blocks are named by chained hashes of their token
  ids, shared between requests by reference count, and kept after use until LRU eviction
  needs the block for something else;
* a **scheduler** (FCFS) that admits at most ``max_num_seqs`` requests, and in each step
  spends at most ``max_num_batched_tokens`` tokens: one per decoding request, the rest on
  prefill (chunked across steps unless ``enable_chunked_prefill`` is off);
* **timing**: a step lasts ``step_base_seconds`` + ``prefill_seconds_per_token`` * the
  uncached prompt tokens it prefills + ``decode_seconds_per_seq`` * the requests it
  decodes, all divided by ``speedup_ratio``. The engine really sleeps that long, and reports
  the simulated seconds charged to each request in ``Chunk.timing``, so tests can check the
  model without reading a clock;
* **output**: token ids drawn from a PRNG seeded by the request's ``seed``, or by a hash of
  the prompt when there is none, so equal requests give equal text.

* **KV events**: with ``enable_kv_events`` the cache reports what it stores and evicts
  (``kvcache.py``), published once per scheduler step to the worker's ``KvPublisher``,
  as vLLM publishes its own; ``reset_prefix_cache`` empties the cache when it is idle.

Simplifications, on purpose: a request reserves KV blocks for its prompt plus its whole
output at admission (so nothing is ever preempted); only prompt blocks enter the prefix
cache; a prompt block becomes reusable once the request's prefill has finished.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import struct
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field, fields
from types import TracebackType
from typing import Self

from dynamod.errors import ConfigError, InvalidInputError, ShuttingDownError
from dynamod.records import ModelCard
from dynamod.tokenizers import SimpleTokenizer
from dynamod.tokenizers.bundle import with_tokenizer
from dynamod.worker.engines.base import (
    Changes,
    Chunk,
    EngineStats,
    FinishReason,
    GenerateRequest,
    Timing,
    Usage,
)
from dynamod.worker.engines.kvcache import Block, KvCache, cache_keys
from dynamod.worker.engines.kvevents import KvPublisher


@dataclass(frozen=True)
class MockerConfig:
    """Every knob of the mocker. Defaults follow Dynamo's mocker and a mid-size model.

    Attributes:
        model_name: the served model's name (the ``model`` field of requests).
        block_size: tokens per KV block (Dynamo's mocker defaults to 64).
        num_kv_blocks: KV blocks in the simulated GPU cache.
        max_num_seqs: requests decoding or prefilling at once; the rest wait (FCFS).
        max_num_batched_tokens: tokens one scheduler step may process; at least
            ``max_num_seqs``, and at least ``context_length`` without chunked prefill.
        context_length: prompt plus output tokens one request may hold.
        enable_prefix_caching: reuse KV blocks of equal prompt prefixes.
        enable_chunked_prefill: split a long prefill across steps.
        enable_kv_events: publish the cache's KV events (``kvcache.py``) for routers.
        speedup_ratio: divides every simulated duration (10 runs ten times faster).
        step_base_seconds: fixed cost of one scheduler step.
        prefill_seconds_per_token: cost of each uncached prompt token prefilled.
        decode_seconds_per_seq: cost per request decoded in a step (grows with batch).
        default_output_tokens: tokens generated before a simulated end of sequence
            (finish reason ``"stop"``) when a request gives no ``max_tokens``.
    """

    model_name: str = "mocker"
    block_size: int = 64
    num_kv_blocks: int = 16384
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    context_length: int = 8192
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    enable_kv_events: bool = True
    speedup_ratio: float = 1.0
    step_base_seconds: float = 0.005
    prefill_seconds_per_token: float = 0.00005
    decode_seconds_per_seq: float = 0.0001
    default_output_tokens: int = 16

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_field(f.name, getattr(self, f.name))
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError(
                f"mocker max_num_batched_tokens ({self.max_num_batched_tokens}) must be at "
                f"least max_num_seqs ({self.max_num_seqs}): every running request decodes "
                "one token per step"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.context_length:
            raise ConfigError(
                f"mocker max_num_batched_tokens ({self.max_num_batched_tokens}) must be at "
                f"least context_length ({self.context_length}) when chunked prefill is off"
            )

    def step_seconds(self, prefill_tokens: int, decode_seqs: int) -> float:
        """Simulated duration of one step that prefills and decodes that much."""
        work = (
            self.step_base_seconds
            + self.prefill_seconds_per_token * prefill_tokens
            + self.decode_seconds_per_seq * decode_seqs
        )
        return work / self.speedup_ratio

    def model_card(self) -> ModelCard:
        return ModelCard(
            name=self.model_name,
            engine="mocker",
            kv_block_size=self.block_size,
            context_length=self.context_length,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            total_kv_blocks=self.num_kv_blocks,
        )


_POSITIVE_INTS = {"block_size", "num_kv_blocks", "max_num_seqs", "max_num_batched_tokens"}
_POSITIVE_INTS |= {"context_length", "default_output_tokens"}
_TIMINGS = {"step_base_seconds", "prefill_seconds_per_token", "decode_seconds_per_seq"}


def _check_field(name: str, value: object) -> None:
    if name == "model_name" and (not isinstance(value, str) or not value):
        raise ConfigError(f"mocker model_name must be a non-empty string, got {value!r}")
    if name.startswith("enable_") and not isinstance(value, bool):
        raise ConfigError(f"mocker {name} must be true or false, got {value!r}")
    if name in _POSITIVE_INTS and (type(value) is not int or value < 1):
        raise ConfigError(f"mocker {name} must be a positive integer, got {value!r}")
    if name in _TIMINGS | {"speedup_ratio"}:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"mocker {name} must be a number, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"mocker {name} must be a finite number >= 0, got {value!r}")
    if name == "speedup_ratio" and value == 0:
        raise ConfigError("mocker speedup_ratio must be greater than 0, got 0")


@dataclass(eq=False)
class _Seq:
    """One request inside the engine."""

    request: GenerateRequest
    budget: int  # tokens to generate
    finish: FinishReason  # reported when the budget is reached
    hashes: list[int]  # of the prompt's full blocks
    rng: random.Random
    outbox: asyncio.Queue[Chunk | ShuttingDownError] = field(default_factory=asyncio.Queue)
    blocks: list[Block] = field(default_factory=list)
    cached_tokens: int = 0
    computed: int = 0  # prompt tokens in the KV cache, cached ones included
    generated: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    done: bool = False

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def prefilled(self) -> bool:
        return self.computed == self.prompt_len


class MockerEngine:
    """The mocker as an ``Engine`` (see ``engines/base.py`` for the contract)."""

    def __init__(self, config: MockerConfig | None = None) -> None:
        self.config = config or MockerConfig()
        self._tokenizer = SimpleTokenizer()
        self._kv = KvCache(
            self.config.num_kv_blocks,
            self.config.block_size,
            prefix_caching=self.config.enable_prefix_caching,
            events=self.config.enable_kv_events and self.config.enable_prefix_caching,
        )
        self._kv_events = KvPublisher(self.config.num_kv_blocks) if self._kv.emits else None
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._changes = Changes()

    @property
    def tokenizer(self) -> SimpleTokenizer:
        return self._tokenizer

    @property
    def changes(self) -> Changes:
        return self._changes

    @property
    def kv_events(self) -> KvPublisher | None:
        return self._kv_events

    def model_card(self) -> ModelCard:
        return with_tokenizer(self.config.model_card(), self._tokenizer)

    async def reset_prefix_cache(self) -> bool:
        """Empty the prefix cache, when no request holds a block (else False)."""
        done = self._kv.reset()
        self._publish()
        return done

    def stats(self) -> EngineStats:
        return EngineStats(
            active_requests=len(self._running),
            waiting_requests=len(self._waiting),
            kv_blocks_used=self._kv.used,
            kv_blocks_total=self._kv.num_blocks,
            prefix_cache_hits=self._kv.hits,
            prefix_cache_queries=self._kv.queries,
        )

    async def __aenter__(self) -> Self:
        if self._task is not None or self._closed:
            raise RuntimeError("a MockerEngine can be entered only once")
        self._task = asyncio.create_task(self._schedule(), name="mocker-scheduler")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closed = True
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.wait([self._task])
        bug = None if self._task.cancelled() else self._task.exception()
        if bug is not None:
            raise bug

    def generate(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        return self._stream(self._admissible(request))

    def _admissible(self, request: GenerateRequest) -> _Seq:
        """Validate ``request`` against the engine's limits and wrap it, or raise."""
        _check_prompt(request, self._tokenizer.vocab_size)
        budget = self._output_budget(request)
        blocks = _blocks_for(len(request.prompt_ids) + budget, self.config.block_size)
        if blocks > self.config.num_kv_blocks:
            raise InvalidInputError(
                f"request {request.request_id!r} needs {blocks} KV blocks but the cache "
                f"holds only {self.config.num_kv_blocks}"
            )
        seed = request.seed if request.seed is not None else _prompt_seed(request.prompt_ids)
        return _Seq(
            request=request,
            budget=budget,
            finish="length" if request.max_tokens is not None else "stop",
            hashes=cache_keys(request.prompt_ids, self.config.block_size),
            rng=random.Random(seed),
        )

    def _output_budget(self, request: GenerateRequest) -> int:
        """Tokens to generate: ``max_tokens``, or a simulated end of sequence without it."""
        prompt, context = len(request.prompt_ids), self.config.context_length
        if request.max_tokens is None:
            if prompt >= context:
                raise InvalidInputError(
                    f"the prompt ({prompt} tokens) leaves no room for output in the "
                    f"model's context length of {context} tokens"
                )
            return min(self.config.default_output_tokens, context - prompt)
        if request.max_tokens < 1:
            raise InvalidInputError(f"max_tokens must be at least 1, got {request.max_tokens}")
        if prompt + request.max_tokens > context:
            raise InvalidInputError(
                f"the prompt ({prompt} tokens) plus max_tokens ({request.max_tokens}) exceeds "
                f"the model's context length of {context} tokens"
            )
        return request.max_tokens

    async def _stream(self, seq: _Seq) -> AsyncGenerator[Chunk, None]:
        if self._task is None or self._closed:
            raise ShuttingDownError("the mocker engine is not running; enter it with 'async with'")
        self._waiting.append(seq)
        self._wake.set()
        self._changes.changed()
        try:
            while True:
                item = await seq.outbox.get()
                if isinstance(item, ShuttingDownError):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            self._retire(seq)

    def _retire(self, seq: _Seq) -> None:
        """Take ``seq`` out of the engine and free its blocks; safe to call twice."""
        if seq.done:
            return
        seq.done = True
        self._changes.changed()
        if seq in self._running:
            self._running.remove(seq)
            self._kv.release(seq.blocks)
            self._wake.set()  # freed blocks may admit a waiting request
        elif seq in self._waiting:
            self._waiting.remove(seq)

    async def _schedule(self) -> None:
        try:
            while True:
                self._admit()
                self._publish()
                if not self._running:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                await self._step()
                self._publish()
        finally:
            self._fail_all()

    def _publish(self) -> None:
        events = self._kv.drain()
        if events and self._kv_events is not None:
            self._kv_events.publish(events)

    def _admit(self) -> None:
        """Move waiting requests to running, in order, while slots and KV blocks last."""
        while self._waiting and len(self._running) < self.config.max_num_seqs:
            seq = self._waiting[0]
            lookup = seq.hashes[: (seq.prompt_len - 1) // self.config.block_size]
            need = _blocks_for(seq.prompt_len + seq.budget, self.config.block_size)
            allocation = self._kv.allocate(lookup, need)
            if allocation is None:
                return  # FCFS: nobody overtakes the head of the queue
            self._waiting.popleft()
            seq.blocks, reused = allocation
            seq.cached_tokens = seq.computed = reused * self.config.block_size
            self._running.append(seq)
            self._changes.changed()

    async def _step(self) -> None:
        decodes = [s for s in self._running if s.prefilled]
        prefills = self._plan_prefills(self.config.max_num_batched_tokens - len(decodes))
        seconds = self.config.step_seconds(sum(n for _, n in prefills), len(decodes))
        await asyncio.sleep(seconds)
        for seq, tokens in prefills:
            self._prefilled(seq, tokens, seconds)
        for seq in decodes:
            if not seq.done:
                seq.decode_seconds += seconds
                self._emit(seq)

    def _plan_prefills(self, budget: int) -> list[tuple[_Seq, int]]:
        plan: list[tuple[_Seq, int]] = []
        for seq in self._running:
            if seq.prefilled:
                continue
            need = seq.prompt_len - seq.computed
            tokens = min(need, budget) if self.config.enable_chunked_prefill else need
            if tokens < 1 or tokens > budget:
                break  # FCFS within the step as well
            plan.append((seq, tokens))
            budget -= tokens
        return plan

    def _prefilled(self, seq: _Seq, tokens: int, seconds: float) -> None:
        if seq.done:
            return  # its consumer went away during the step
        seq.computed += tokens
        seq.prefill_seconds += seconds
        if seq.prefilled:
            self._kv.commit(seq.blocks, seq.hashes, seq.request.prompt_ids)
            self._emit(seq)  # the step that ends prefill samples the first token

    def _emit(self, seq: _Seq) -> None:
        token = seq.rng.randrange(self._tokenizer.vocab_size)
        seq.generated.append(token)
        finished = len(seq.generated) >= seq.budget
        seq.outbox.put_nowait(
            Chunk(
                text=self._tokenizer.decode([token]),
                token_ids=(token,),
                usage=Usage(seq.prompt_len, len(seq.generated), seq.cached_tokens),
                timing=Timing(seq.prefill_seconds, seq.decode_seconds),
                finish_reason=seq.finish if finished else None,
            )
        )
        if finished:
            self._retire(seq)

    def _fail_all(self) -> None:
        for seq in [*self._running, *self._waiting]:
            seq.outbox.put_nowait(ShuttingDownError("the mocker engine stopped"))
            self._retire(seq)


def _check_prompt(request: GenerateRequest, vocab_size: int) -> None:
    if not request.prompt_ids:
        raise InvalidInputError("the prompt is empty; give at least one token")
    bad = next((t for t in request.prompt_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidInputError(
            f"prompt token id {bad} is outside the vocabulary [0, {vocab_size})"
        )


def _blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def _prompt_seed(prompt_ids: Sequence[int]) -> int:
    packed = struct.pack(f"<{len(prompt_ids)}q", *prompt_ids)
    return int.from_bytes(hashlib.blake2b(packed, digest_size=8).digest(), "big")
