"""Where a request is read: on the event loop when it is small and its tokenizer is this
project's own, in the prompt processes (``processes.py``) otherwise.

Reading a body is parsing its JSON, checking its fields and tokenizing its prompt, all of
which hold the GIL for the whole call: the mocker's tokenizer takes ~0.45 s per MB of
prompt on this project's 2-core machine, so an 8 MB body would stall every other request,
``/health`` and gRPC for seconds. A body over ``OFFLOAD_ABOVE`` bytes (about 30 ms of
tokenizing at that rate) goes to a worker process instead; a smaller one costs less on the
loop than the copy to a process would. ``bench/big_prompt.py`` measures what the loop
answers meanwhile, and what a thread would have left of it.

A model's own tokenizer (every one but the mocker's ``SimpleTokenizer``) is untrusted code:
its chat template is a program its worker sent, and its ``tokenizer.json`` pipeline may be
as costly as its author wished. Whatever the body's size, such a prompt is rendered and
tokenized in a prompt process, within the processes' limits (``tokenizers.limits``), and a
failure is answered as the model's (``ModelTemplateError``: a 500 naming the model, and
one log line here). ``bench/template_cost.py`` measures what that costs a small request.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar, cast

from dynamod.http.openai import ModelTemplateError, OpenAIApi, json_object
from dynamod.jsoncodec import Json
from dynamod.prompts.body import (
    CardLimits,
    Head,
    ReadyRequest,
    Tokenized,
    read_head,
    read_prompt,
    tokenize_text,
)
from dynamod.prompts.processes import PromptProcesses
from dynamod.tokenizers import SimpleTokenizer, Tokenizer
from dynamod.tokenizers.bundle import Publishable

log = logging.getLogger(__name__)

OFFLOAD_ABOVE = 64 * 1024
"""Bytes of body (or characters of an ``explain`` prompt) above which reading it leaves
the event loop."""
T = TypeVar("T")


@dataclass(frozen=True)
class Read:
    """A body whose head is read: ``body`` is its parsed JSON when it was read on the loop
    (None when a worker process read it and will parse it again)."""

    raw: bytes
    head: Head
    body: Json | None


class PromptReader:
    """Reads requests for the front and prompts for ``explain``; ``workers`` None reads
    everything on the loop (tools and tests that serve small requests and trust their
    tokenizers)."""

    def __init__(self, workers: PromptProcesses | None, offload_above: int = OFFLOAD_ABOVE):
        self._workers = workers
        self._above = offload_above

    def _offloaded(self, size: int, tokenizer: Tokenizer | None = None) -> PromptProcesses | None:
        """The processes, when a body of ``size`` bytes read with ``tokenizer`` (None: no
        tokenizer yet) leaves the loop: when it is large, or the tokenizer is a model's own.
        A tokenizer that cannot travel (a test double) stays here."""
        if self._workers is None:
            return None
        if tokenizer is None:
            return self._workers if size > self._above else None
        if not _publishable(tokenizer):
            return None
        untrusted = not isinstance(tokenizer, SimpleTokenizer)
        return self._workers if untrusted or size > self._above else None

    async def read_head(self, raw: bytes) -> Read:
        """The body's model and ``nvext``; raises ``FieldError``."""
        workers = self._offloaded(len(raw))
        if workers is not None:
            return Read(raw, await workers.read_head(raw), None)
        body = json_object(raw)
        return Read(raw, read_head(body), body)

    async def read_prompt(
        self, read: Read, api: OpenAIApi, tokenizer: Tokenizer, model: CardLimits
    ) -> ReadyRequest:
        """``body.read_prompt`` of the body, where its size and tokenizer say; raises
        ``FieldError`` (``ModelTemplateError`` when the model's tokenizer failed)."""
        workers = self._offloaded(len(read.raw), tokenizer)
        if workers is not None:
            publishable = cast(Publishable, tokenizer)
            return await _logged(workers.read_prompt(read.raw, api, publishable, model))
        body = read.body if read.body is not None else json_object(read.raw)
        return read_prompt(body, read.raw, api, tokenizer, model)

    async def tokenize_text(self, text: str, tokenizer: Tokenizer, block_size: int) -> Tokenized:
        """``body.tokenize_text`` of a bare prompt, off the loop when it is long or the
        tokenizer is a model's own."""
        workers = self._offloaded(len(text), tokenizer)
        if workers is not None:
            publishable = cast(Publishable, tokenizer)
            return await _logged(workers.tokenize_text(text, publishable, block_size))
        return tokenize_text(text, tokenizer, block_size)


async def _logged(job: Awaitable[T]) -> T:
    """``job``'s result; a model's tokenizer failing is logged, one line, and raised."""
    try:
        return await job
    except ModelTemplateError as exc:
        log.warning("refused a request: %s", exc)
        raise


def _publishable(tokenizer: Tokenizer) -> bool:
    """Whether the tokenizer can travel to a worker process (as its bundle); every
    tokenizer a worker publishes can, so this is False only for test doubles."""
    return callable(getattr(tokenizer, "bundle", None))
