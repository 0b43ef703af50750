"""Reading OpenAI-style request bodies: the parts the worker and the router's front share.

Both must agree on how a prompt becomes token ids (the front counts tokens and hashes
prompt blocks for prefix-aware routing; the worker generates from them), so both call
these functions. A refused field raises ``FieldError`` naming it (``param``).
"""

from __future__ import annotations

import json
from typing import Any

from dynamod.errors import InvalidInputError
from dynamod.worker.engines.base import Tokenizer
from dynamod.worker.tokenizer import ChatMessage

Json = dict[str, Any]
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


class FieldError(InvalidInputError):
    """A body field is missing or malformed; ``param`` names it, ``status`` is the HTTP
    answer (400, or 413 for a body over the size limit)."""

    def __init__(self, param: str | None, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


def brief(value: object, limit: int = 80) -> str:
    """The repr of a refused value, cut short: a bad prompt may be megabytes long."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def json_object(raw: bytes) -> Json:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FieldError(None, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise FieldError(None, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def model_of(body: Json) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise FieldError("model", f"model must be a non-empty string, got {brief(model)}")
    return model


def completion_prompt(body: Json, tokenizer: Tokenizer) -> tuple[int, ...]:
    """A prompt is a string or a list of token ids; a list holding one of those also works."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tuple(tokenizer.encode(prompt))
    if isinstance(prompt, list) and all(type(t) is int for t in prompt):
        return tuple(prompt)
    raise FieldError(
        "prompt",
        f"prompt must be a string or a list of token ids (one prompt), got {brief(prompt)}",
    )


def chat_prompt(body: Json, tokenizer: Tokenizer) -> tuple[int, ...]:
    """The messages rendered with the tokenizer's chat template, then encoded."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise FieldError("messages", f"messages must be a non-empty list, got {brief(messages)}")
    turns = [_message(i, m) for i, m in enumerate(messages)]
    return tuple(tokenizer.encode(tokenizer.render_chat(turns)))


def _message(index: int, message: object) -> ChatMessage:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise FieldError(where, f"{where} must be an object, got {brief(message)}")
    role = message.get("role")
    if role not in ROLES:
        roles = ", ".join(sorted(ROLES))
        raise FieldError(f"{where}.role", f"{where}.role must be one of {roles}; got {brief(role)}")
    return ChatMessage(role=role, content=_content(where, message.get("content")))


def _content(where: str, content: object) -> str:
    """Message content: a string, null, or a list of ``{"type": "text", "text": ...}`` parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(parts) == len(content) and all(isinstance(p, str) for p in parts):
            return "".join(str(p) for p in parts)
    raise FieldError(
        f"{where}.content",
        f"{where}.content must be a string or a list of text parts; got {brief(content)}",
    )
