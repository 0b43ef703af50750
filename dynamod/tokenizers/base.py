"""The tokenizer contract: text to token ids and back, and the model's chat template.

The front tokenizes prompts with the very tokenizer the workers of a model use, so token
counts and KV block hashes are the ones the engine sees; the worker's inference routes use
it to read prompts; ``explain`` uses the front's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ChatMessage:
    """One turn of a chat: ``role`` (system, user, assistant, ...) and its text."""

    role: str
    content: str


class Tokenizer(Protocol):
    """Text to token ids and back, plus the model's chat template."""

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def render_chat(self, messages: Sequence[ChatMessage]) -> str: ...
