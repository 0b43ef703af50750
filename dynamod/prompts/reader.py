"""Where a request is read: on the event loop when it is small, in the prompt worker
processes (``workers.py``) when it is large.

Reading a body is parsing its JSON, checking its fields and tokenizing its prompt, all of
which hold the GIL for the whole call: the mocker's tokenizer takes ~0.45 s per MB of
prompt on this project's 2-core machine, so an 8 MB body would stall every other request,
``/health`` and gRPC for seconds. A body over ``OFFLOAD_ABOVE`` bytes (about 30 ms of
tokenizing at that rate) goes to a worker process instead; a smaller one costs less on the
loop than the copy to a process would. ``bench/big_prompt.py`` measures what the loop
answers meanwhile, and what a thread would have left of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from dynamod.http.openai import Json, OpenAIApi, json_object
from dynamod.prompts.body import (
    CardLimits,
    Head,
    Routable,
    Tokenized,
    read_head,
    read_prompt,
    tokenize_text,
)
from dynamod.prompts.processes import PromptProcesses
from dynamod.tokenizers import Tokenizer
from dynamod.tokenizers.bundle import Publishable

OFFLOAD_ABOVE = 64 * 1024
"""Bytes of body (or characters of an ``explain`` prompt) above which reading it leaves
the event loop."""


@dataclass(frozen=True)
class Read:
    """A body whose head is read: ``body`` is its parsed JSON when it was read on the loop
    (None when a worker process read it and will parse it again)."""

    raw: bytes
    head: Head
    body: Json | None


class PromptReader:
    """Reads requests for the front and prompts for ``explain``; ``workers`` None reads
    everything on the loop (tools and tests that serve small requests)."""

    def __init__(self, workers: PromptProcesses | None, offload_above: int = OFFLOAD_ABOVE):
        self._workers = workers
        self._above = offload_above

    def _offloaded(self, size: int) -> PromptProcesses | None:
        return self._workers if size > self._above else None

    async def read_head(self, raw: bytes) -> Read:
        """The body's model and ``nvext``; raises ``FieldError``."""
        workers = self._offloaded(len(raw))
        if workers is not None:
            return Read(raw, await workers.read_head(raw), None)
        body = json_object(raw)
        return Read(raw, read_head(body), body)

    async def read_prompt(
        self, read: Read, api: OpenAIApi, tokenizer: Tokenizer, model: CardLimits
    ) -> Routable:
        """``body.prepare`` of the body, where ``head`` read it; raises ``FieldError``."""
        if read.body is None and _publishable(tokenizer) and self._workers is not None:
            return await self._workers.read_prompt(
                read.raw, api, cast(Publishable, tokenizer), model
            )
        body = read.body if read.body is not None else json_object(read.raw)
        return read_prompt(body, read.raw, api, tokenizer, model)

    async def tokenize_text(self, text: str, tokenizer: Tokenizer, block_size: int) -> Tokenized:
        """``body.tokenize`` of a bare prompt, off the loop when it is long."""
        workers = self._offloaded(len(text))
        if workers is not None and _publishable(tokenizer):
            return await workers.tokenize_text(text, cast(Publishable, tokenizer), block_size)
        return tokenize_text(text, tokenizer, block_size)


def _publishable(tokenizer: Tokenizer) -> bool:
    """Whether the tokenizer can travel to a worker process (as its bundle); every
    tokenizer a worker publishes can, so this is False only for test doubles."""
    return callable(getattr(tokenizer, "bundle", None))
