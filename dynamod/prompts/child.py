"""A prompt worker process: ``python -m dynamod.prompts.child``, started by ``workers.py``.

It reads jobs from stdin and writes answers to stdout (``wire.py``), one at a time, until
stdin ends: the daemon owns its life, so it ignores SIGINT and SIGTERM (a Ctrl-C or a
``systemctl stop`` reaches the whole process group; the daemon then closes the pipe once
its drain is over). Everything it would print goes to stderr, the daemon's, so that
nothing but frames reaches stdout. It keeps the last ``CAPACITY`` tokenizers it was sent.
"""

from __future__ import annotations

import os
import signal
import sys
from collections import OrderedDict
from typing import Any, BinaryIO

from dynamod.errors import InvalidInputError
from dynamod.http.openai import API_BY_KIND, json_object
from dynamod.prompts import wire
from dynamod.prompts.body import read_head, read_prompt, tokenize_text
from dynamod.tokenizers import Tokenizer
from dynamod.tokenizers.bundle import from_bundle

CAPACITY = 8


class Worker:
    """Runs jobs; holds the tokenizers it was sent, by checksum."""

    def __init__(self) -> None:
        self._tokenizers: OrderedDict[str, Tokenizer] = OrderedDict()

    def answer(self, job: tuple[Any, ...]) -> tuple[str, Any]:
        try:
            return self._run(*job)
        except InvalidInputError as exc:  # FieldError included: the request's refusal
            return ("error", exc)

    def _run(self, op: str, *args: Any) -> tuple[str, Any]:
        if op == "head":
            (raw,) = args
            return ("ok", read_head(json_object(raw)))
        if op == "prepare":
            raw, kind, checksum, model = args
            tokenizer = self._tokenizers.get(checksum)
            if tokenizer is None:
                return ("need", checksum)
            api = API_BY_KIND[kind]
            return ("ok", read_prompt(json_object(raw), raw, api, tokenizer, model))
        if op == "tokenize":
            text, checksum, block_size = args
            tokenizer = self._tokenizers.get(checksum)
            if tokenizer is None:
                return ("need", checksum)
            return ("ok", tokenize_text(text, tokenizer, block_size))
        if op == "tokenizer":
            checksum, bundle = args
            self._tokenizers[checksum] = from_bundle(bundle)
            while len(self._tokenizers) > CAPACITY:
                self._tokenizers.popitem(last=False)
            return ("ok", None)
        raise ValueError(f"unknown prompt job {op!r}; known: {', '.join(wire.OPS)}")


def serve(jobs: BinaryIO, answers: BinaryIO) -> None:
    worker = Worker()
    while (frame := wire.read_frame(jobs)) is not None:
        answers.write(wire.encode(worker.answer(wire.decode(frame))))
        answers.flush()


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints go to stderr
    with answers:
        serve(sys.stdin.buffer, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
