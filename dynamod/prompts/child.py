"""A prompt process: ``python -m dynamod.prompts.child LIMITS``, started by
``processes.py`` (``LIMITS``: the ``TokenizerLimits`` as JSON, ``limits_arg``).

It reads jobs from stdin and writes answers to stdout (``wire.py``), one at a time, until
stdin ends: the daemon owns its life, so it ignores SIGINT and SIGTERM (a Ctrl-C or a
``systemctl stop`` reaches the whole process group; the daemon then closes the pipe once
its drain is over). Everything it would print goes to stderr, the daemon's, so that
nothing but frames reaches stdout.

It runs models' own tokenizers, which are untrusted code (``tokenizers/limits.py``), so:
its address space is capped (``process_memory``); every call into a model's tokenizer —
building it from its bundle, rendering its chat template, encoding — runs within a CPU
budget (``cpu_seconds``, plus as much per MiB of text; ``cpu_budget.py``); and whatever such a
call raises is answered as a refusal, never left to end the process. It keeps the last
``CAPACITY`` tokenizers it was sent, and at most ``cache_bytes`` of their bundles.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from typing import Any, BinaryIO, TypeVar

from dynamod.errors import DynamoError, PromptWorkerError
from dynamod.http.openai import API_BY_KIND, json_object
from dynamod.prompts import cpu_budget, wire
from dynamod.prompts.body import read_head, read_prompt, tokenize_text
from dynamod.tokenizers import ChatMessage, SimpleTokenizer, Tokenizer
from dynamod.tokenizers.base import TokenizerFailedError
from dynamod.tokenizers.bundle import TokenizerUnavailableError, load
from dynamod.tokenizers.limits import MIB, TokenizerLimits

CAPACITY = 8
T = TypeVar("T")


def limits_arg(limits: TokenizerLimits) -> str:
    """``limits`` as the child's argument."""
    return json.dumps(asdict(limits))


class ChildJobs:
    """Runs jobs; holds the tokenizers it was sent, by checksum."""

    def __init__(self, limits: TokenizerLimits) -> None:
        self._limits = limits
        self._tokenizers: OrderedDict[str, tuple[Tokenizer, int]] = OrderedDict()

    def answer(self, job: tuple[Any, ...]) -> tuple[str, Any]:
        try:
            return self._run(*job)
        except DynamoError as exc:  # the request's refusal, or a model's tokenizer failing
            return ("error", exc)
        except Exception as exc:  # noqa: BLE001 - a fault here costs this job, not the process
            return ("error", PromptWorkerError(f"the prompt process failed: {exc!r:.300}"))

    def _run(self, op: str, *args: Any) -> tuple[str, Any]:
        if op == "head":
            (raw,) = args
            return ("ok", read_head(json_object(raw)))
        if op == "prepare":
            raw, kind, checksum, model = args
            tokenizer = self._tokenizer(checksum)
            if tokenizer is None:
                return ("need", checksum)
            api = API_BY_KIND[kind]
            return ("ok", read_prompt(json_object(raw), raw, api, tokenizer, model))
        if op == "tokenize":
            text, checksum, block_size = args
            tokenizer = self._tokenizer(checksum)
            if tokenizer is None:
                return ("need", checksum)
            return ("ok", tokenize_text(text, tokenizer, block_size))
        if op == "tokenizer":
            checksum, raw = args
            self._remember(checksum, self._build(checksum, raw), len(raw))
            return ("ok", None)
        raise ValueError(f"unknown prompt job {op!r}; known: {', '.join(wire.OPS)}")

    def _tokenizer(self, checksum: str) -> Tokenizer | None:
        held = self._tokenizers.get(checksum)
        if held is None:
            return None
        self._tokenizers.move_to_end(checksum)
        tokenizer = held[0]
        if isinstance(tokenizer, SimpleTokenizer):  # this project's own code
            return tokenizer
        return Budgeted(tokenizer, self._limits)

    def _build(self, checksum: str, raw: bytes) -> Tokenizer:
        seconds = self._limits.cpu_for(len(raw))
        try:
            with cpu_budget.cpu_budget(seconds):
                return load(raw, checksum, max_output=self._limits.max_output)
        except cpu_budget.CpuBudgetExceeded as exc:
            raise TokenizerUnavailableError(f"building the tokenizer {exc}") from None
        except DynamoError:
            raise
        except Exception as exc:  # noqa: BLE001 - the model's files may break the library
            raise TokenizerUnavailableError(f"the tokenizer does not build: {exc!r:.300}") from None

    def _remember(self, checksum: str, tokenizer: Tokenizer, size: int) -> None:
        self._tokenizers[checksum] = (tokenizer, size)
        self._tokenizers.move_to_end(checksum)
        while len(self._tokenizers) > 1 and (
            len(self._tokenizers) > CAPACITY
            or sum(size for _, size in self._tokenizers.values()) > self._limits.cache_bytes
        ):
            self._tokenizers.popitem(last=False)


class Budgeted:
    """A model's own tokenizer whose every call runs within its CPU budget: ``cpu_seconds``
    plus as much per MiB of the text it reads (``TokenizerLimits.cpu_for``)."""

    def __init__(self, tokenizer: Tokenizer, limits: TokenizerLimits) -> None:
        self._tokenizer = tokenizer
        self._limits = limits

    @property
    def checksum(self) -> str:
        return self._tokenizer.checksum

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.vocab_size

    def encode(self, text: str) -> list[int]:
        return self._within(len(text), lambda: self._tokenizer.encode(text))

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        size = sum(len(m.content) for m in messages)
        return self._within(size, lambda: self._tokenizer.encode_chat(messages))

    def decode(self, ids: Iterable[int]) -> str:
        return self._tokenizer.decode(ids)

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        size = sum(len(m.content) for m in messages)
        return self._within(size, lambda: self._tokenizer.render_chat(messages))

    def _within(self, characters: int, call: Callable[[], T]) -> T:
        try:
            with cpu_budget.cpu_budget(self._limits.cpu_for(characters)):
                return call()
        except cpu_budget.CpuBudgetExceeded as exc:
            raise TokenizerFailedError(
                f"its chat template or tokenizer {exc} (template_cpu_seconds: "
                f"{self._limits.cpu_seconds:g} s, plus as much per MiB of prompt)"
            ) from None
        except MemoryError:
            raise TokenizerFailedError(
                "its chat template or tokenizer ran out of the prompt process's memory "
                f"({self._limits.process_memory // MIB} MiB, prompt_process_memory_mb)"
            ) from None


def serve(jobs: BinaryIO, answers: BinaryIO, limits: TokenizerLimits) -> None:
    worker = ChildJobs(limits)
    while (frame := wire.read_frame(jobs)) is not None:
        answers.write(wire.encode(worker.answer(wire.decode(frame))))
        answers.flush()


def main() -> int:
    limits = TokenizerLimits(**json.loads(sys.argv[1])) if len(sys.argv) > 1 else TokenizerLimits()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    cpu_budget.install()
    cpu_budget.limit_memory(limits.process_memory)
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints go to stderr
    with answers:
        serve(sys.stdin.buffer, answers, limits)
    return 0


if __name__ == "__main__":
    sys.exit(main())
