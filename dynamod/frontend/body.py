"""Reading an inbound OpenAI request: the little the front needs to route it.

The body is forwarded to the worker byte for byte. The worker ignores keys it does not
know (``nvext`` among them) and validates everything else itself; its 400 answers are
passed on. The front reads only:

* ``model``: a non-empty string;
* the prompt: ``prompt`` for completions (a string or a list of token ids, or a list
  holding one of those), ``messages`` for chat, rendered with the tokenizer's chat
  template exactly as the worker renders them, so the prompt's token count and KV block
  hashes are the ones the worker will see;
* ``nvext.routing_constraints``: ``RoutingConstraints.from_json`` (an unknown key is
  refused and named);
* ``nvext.max_wait``: seconds this request may wait for a worker (the router's limits
  otherwise). Other ``nvext`` keys are left to the worker.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from dynamod.errors import ConstraintError, InvalidInputError
from dynamod.router import RouteRequest, hash_blocks
from dynamod.taints import RoutingConstraints
from dynamod.worker.engines.base import Tokenizer
from dynamod.worker.tokenizer import ChatMessage

Json = dict[str, Any]


class BadRequest(InvalidInputError):
    """The request cannot be routed as sent; ``param`` names the field, ``status`` the
    HTTP answer (400, or 413 for a body over the application's size limit)."""

    def __init__(self, param: str | None, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


@dataclass(frozen=True)
class Api:
    """One inference route: its metric label, its path and how its prompt is read."""

    route: str
    path: str
    prompt: Callable[[Json, Tokenizer], list[int]]


@dataclass(frozen=True)
class Inbound:
    """A request, read: the raw body to forward and what routing needs from it."""

    api: Api
    raw: bytes
    model: str
    prompt_ids: tuple[int, ...]
    constraints: RoutingConstraints
    max_wait: float | None

    def route_request(self, block_size: int) -> RouteRequest:
        """The router's request, with block hashes for a model of ``block_size``."""
        return RouteRequest(
            model=self.model,
            constraints=self.constraints,
            prompt_tokens=len(self.prompt_ids),
            block_hashes=hash_blocks(self.prompt_ids, block_size),
            max_wait=self.max_wait,
        )


async def read_inbound(request: web.Request, api: Api, tokenizer: Tokenizer) -> Inbound:
    """Read and check the body of ``request``; raises ``BadRequest``."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise BadRequest(None, f"the request body is too large: {exc.text}", status=413) from None
    body = _json_object(raw)
    model = _model(body)
    constraints, max_wait = _nvext(body.get("nvext"))
    prompt = api.prompt(body, tokenizer)
    return Inbound(api, raw, model, tuple(prompt), constraints, max_wait)


def _json_object(raw: bytes) -> Json:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(None, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(None, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _brief(value: object, limit: int = 80) -> str:
    """The repr of a refused value, cut short: a bad prompt may be megabytes long."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _model(body: Json) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model", f"model must be a non-empty string, got {_brief(model)}")
    return model


def _nvext(nvext: object) -> tuple[RoutingConstraints, float | None]:
    if nvext is None:
        return RoutingConstraints(), None
    if not isinstance(nvext, dict):
        raise BadRequest("nvext", f"nvext must be a JSON object, got {_brief(nvext)}")
    try:
        constraints = RoutingConstraints.from_json(nvext.get("routing_constraints"))
    except ConstraintError as exc:
        raise BadRequest("nvext.routing_constraints", str(exc)) from None
    return constraints, _max_wait(nvext.get("max_wait"))


def _max_wait(value: object) -> float | None:
    if value is None:
        return None
    # JSON true/false are not numbers, although Python's bool subclasses int.
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise BadRequest(
            "nvext.max_wait",
            f"nvext.max_wait must be a finite number of seconds, at least 0; got {_brief(value)}",
        )
    return float(value)


def completion_prompt(body: Json, tokenizer: Tokenizer) -> list[int]:
    """A prompt is a string or a list of token ids; a list holding one of those also works."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if isinstance(prompt, list) and all(type(t) is int for t in prompt):
        return prompt
    raise BadRequest(
        "prompt",
        f"prompt must be a string or a list of token ids (one prompt), got {_brief(prompt)}",
    )


def chat_prompt(body: Json, tokenizer: Tokenizer) -> list[int]:
    """The messages rendered with the chat template, then encoded."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages", f"messages must be a non-empty list, got {_brief(messages)}")
    turns = [_turn(i, m) for i, m in enumerate(messages)]
    return tokenizer.encode(tokenizer.render_chat(turns))


def _turn(index: int, message: object) -> ChatMessage:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise BadRequest(where, f"{where} must be an object, got {_brief(message)}")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise BadRequest(f"{where}.role", f"{where}.role must be a non-empty string; got {role!r}")
    return ChatMessage(role=role, content=_content(where, message.get("content")))


def _content(where: str, content: object) -> str:
    """Message content: a string, null, or a list of ``{"type": "text", "text": ...}`` parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(parts) == len(content) and all(isinstance(p, str) for p in parts):
            return "".join(str(p) for p in parts)
    raise BadRequest(
        f"{where}.content",
        f"{where}.content must be a string or a list of text parts; got {_brief(content)}",
    )


COMPLETIONS = Api("completions", "/v1/completions", completion_prompt)
CHAT = Api("chat_completions", "/v1/chat/completions", chat_prompt)
