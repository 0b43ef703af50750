"""The tokenizer contract: text to token ids and back, and the model's chat template.

The front tokenizes prompts with the very tokenizer the workers of a model use (the worker
publishes it, the daemon fetches it: ``bundle.py``), so token counts and KV block hashes
are the ones the engine sees; the worker's inference routes use it to read prompts;
``explain`` uses the front's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dynamod import jsoncodec
from dynamod.errors import DynamoError, InvalidInputError


class TemplateRefusedError(InvalidInputError):
    """A model's chat template refused the messages on purpose (its ``raise_exception``,
    as Hugging Face templates refuse roles out of order): the request's fault."""


class TokenizerFailedError(DynamoError):
    """A model's own tokenizer, its chat template included, failed on a request or ran past
    a bound (the characters it may render, the CPU time it may take). Workers publish it
    and the daemon runs it as untrusted code: the model is at fault, not the request, and
    must be fixed where it is served."""


@dataclass(frozen=True)
class ChatMessage:
    """One turn of a chat: ``role`` (system, user, assistant, ...) and its text."""

    role: str
    content: str


class Tokenizer(Protocol):
    """Text to token ids and back, plus the model's chat template.

    ``encode`` reads a completion prompt as the model's own server would (special tokens
    such as a leading BOS included); ``encode_chat`` renders the chat template and encodes
    the result without adding special tokens again (the template writes them).
    ``checksum`` names the tokenizer: equal checksums, equal ids for equal text.
    """

    @property
    def vocab_size(self) -> int: ...

    @property
    def checksum(self) -> str: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def render_chat(self, messages: Sequence[ChatMessage]) -> str: ...


def bundle_checksum(bundle: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of a published tokenizer bundle's canonical JSON: the bytes a worker
    serves and a daemon verifies."""
    return "sha256:" + hashlib.sha256(jsoncodec.canonical(bundle)).hexdigest()
