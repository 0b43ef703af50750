"""The OpenAI wire format, as far as the worker's inference routes and the daemon's front
share it: reading request bodies, the checks on their fields, the error shape, and the
worker-id header.

Both must agree on how a prompt becomes token ids (the front counts tokens and hashes
prompt blocks for prefix-aware routing; the worker generates from them), and on which
bodies are refused (the front refuses, before routing, what a worker would refuse:
``sampling`` and ``check_fits``), so both call these functions. A refused field raises
``FieldError`` naming it (``param``).

An error is ``{"error": {"message", "type", "param", "code"}}``; ``type`` is
``invalid_request_error`` below 500 (``rate_limit_error`` for 429) and ``server_error``
from 500. An error after a stream has started is one ``data: {"error": ...}`` event.

JSON goes through orjson both ways (``http/limits.py`` parses, ``dump_json`` writes): a
prompt's token ids are written by the front and read by the worker on every request, and
orjson does both faster than the standard library (``bench/codec.py``
measures it; the README's dependency notes give the figures).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web

from dynamod import jsoncodec
from dynamod.errors import InvalidInputError
from dynamod.http.limits import fits_body
from dynamod.jsoncodec import Json
from dynamod.tokenizers import ChatMessage, Tokenizer
from dynamod.tokenizers.base import TemplateRefusedError, TokenizerFailedError

WORKER_ID_HEADER = "x-dynamo-worker-id"
"""On every answer of a worker, and on every answer the front gives after choosing one."""
FORWARDED_IDS = "token_ids"
FORWARDED_TOKENIZER = "tokenizer"
"""The ``nvext`` keys the front forwards a tokenized prompt in (``forwarded_ids``)."""
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
FORWARDING_ENGINES = frozenset({"openai"})
"""Engines whose worker passes a request's body on to an upstream server as it is
(``worker/proxy.py``): the upstream checks it, so neither the worker nor the front does.
Every other engine's worker serves its own inference routes, which run ``sampling`` and
whose engines refuse what ``check_fits`` refuses."""


class FieldError(InvalidInputError):
    """A body field is missing or malformed; ``param`` names it, ``status`` is the HTTP
    answer (400, or 413 for a body over the size limit)."""

    def __init__(self, param: str | None, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status

    def fields(self) -> dict[str, object]:
        return {"param": self.param, "message": str(self), "status": self.status}


class ModelTemplateError(FieldError):
    """The model's own chat template or tokenizer failed on this request or ran past a
    bound (``tokenizers.base.TokenizerFailedError``): the model is at fault, not the
    request, so the answer is a 500 (``server_error``) whose message names the model;
    ``openai_code`` is the OpenAI error code it is answered with. ``param`` is the prompt's
    field (``messages`` or ``prompt``)."""

    openai_code = "model_template_error"

    def __init__(self, model: str, param: str, reason: str) -> None:
        super().__init__(param, f"model {model!r}: {reason}" if model else reason, status=500)
        self.model = model
        self.reason = reason

    def fields(self) -> dict[str, object]:
        return {"model": self.model, "param": self.param, "reason": self.reason}


def brief(value: object, limit: int = 80) -> str:
    """The repr of a refused value, cut short: a bad prompt may be megabytes long."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def json_object(raw: bytes) -> Json:
    try:
        body = jsoncodec.read(raw)
    except InvalidInputError as exc:
        raise FieldError(None, str(exc)) from None
    if not isinstance(body, dict):
        raise FieldError(None, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def model_of(body: Json) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise FieldError("model", f"model must be a non-empty string, got {brief(model)}")
    return model


def forwarded_ids(body: Json, tokenizer: Tokenizer) -> tuple[int, ...] | None:
    """The prompt's token ids as the front computed them, when it used this very tokenizer.

    The front adds ``nvext.token_ids`` and ``nvext.tokenizer`` (the checksum of the
    tokenizer it used) to a text or chat request it forwards, so the worker need not
    tokenize again. They are taken only when the checksum is this tokenizer's own, and are
    trusted as far as a token-id prompt from any client is: the engine checks every id
    against its vocabulary and the prompt's length against its context.
    """
    nvext = body.get("nvext")
    if not isinstance(nvext, dict) or nvext.get(FORWARDED_TOKENIZER) != tokenizer.checksum:
        return None
    ids = nvext.get(FORWARDED_IDS)
    if isinstance(ids, list) and all(type(t) is int for t in ids):
        return tuple(ids)
    raise FieldError(
        f"nvext.{FORWARDED_IDS}",
        f"nvext.{FORWARDED_IDS} must be a list of token ids, got {brief(ids)}",
    )


def with_forwarded_ids(body: Json, ids: tuple[int, ...], tokenizer: Tokenizer, raw: bytes) -> bytes:
    """``body`` as JSON, carrying ``ids`` for the worker (see ``forwarded_ids``); ``raw``
    (the body as it came) when that would make it too large for the worker to take
    (``limits.fits_body``): the worker then tokenizes the prompt itself. So a body the
    front took is never refused by the worker for its size."""
    nvext = body.get("nvext")
    extended = {**(nvext if isinstance(nvext, dict) else {})}
    extended[FORWARDED_IDS] = list(ids)
    extended[FORWARDED_TOKENIZER] = tokenizer.checksum
    forwarded = jsoncodec.write({**body, "nvext": extended})
    return forwarded if fits_body(len(forwarded)) else raw


def completion_prompt(body: Json, tokenizer: Tokenizer) -> tuple[int, ...]:
    """A prompt is a string or a list of token ids; a list holding one of those also works."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        forwarded = forwarded_ids(body, tokenizer)
        if forwarded is not None:
            return forwarded
        try:
            return tuple(tokenizer.encode(prompt))
        except TokenizerFailedError as exc:
            raise ModelTemplateError(model_of(body), "prompt", str(exc)) from None
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
    forwarded = forwarded_ids(body, tokenizer)
    if forwarded is not None:
        return forwarded
    try:
        return tuple(tokenizer.encode_chat(turns))
    except TemplateRefusedError as exc:  # the template refused these messages: a 400
        raise FieldError("messages", f"model {model_of(body)!r}: {exc}") from None
    except TokenizerFailedError as exc:  # the model's template broke or overran: a 500
        raise ModelTemplateError(model_of(body), "messages", str(exc)) from None
    except InvalidInputError as exc:  # no chat template
        raise FieldError("messages", str(exc)) from None


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


def json_response(
    data: object, *, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    """A JSON answer written by ``dump_json``."""
    return web.Response(
        body=jsoncodec.write(data), status=status, headers=headers, content_type="application/json"
    )


@dataclass(frozen=True)
class Sampling:
    """What a request asks of the engine besides its prompt, once checked (``sampling``).
    ``max_tokens_name`` is the field ``max_tokens`` came from, for messages."""

    model: str
    max_tokens: int | None
    max_tokens_name: str
    seed: int | None
    temperature: float | None
    top_p: float | None
    ignore_eos: bool
    stream: bool
    include_usage: bool


def sampling(body: Json, api: OpenAIApi) -> Sampling:
    """The body's fields besides the prompt, checked as the worker's inference routes check
    them; raises ``FieldError`` naming the first bad one. JSON booleans are refused where
    numbers are expected, although Python's bool subclasses int."""
    name = "max_tokens"
    if api.kind == "chat" and body.get("max_completion_tokens") is not None:
        name = "max_completion_tokens"  # the chat API's newer name wins when both are sent
    max_tokens = _optional(body, name, int, "a positive integer")
    if max_tokens is not None and max_tokens < 1:
        raise FieldError(name, f"{name} must be at least 1, got {max_tokens}")
    n = _optional(body, "n", int, "an integer")
    if n not in (None, 1):
        raise FieldError("n", f"n must be 1: a worker generates one choice, got {n}")
    stream = _flag(body, "stream")
    return Sampling(
        model=model_of(body),
        max_tokens=max_tokens,
        max_tokens_name=name,
        seed=_optional(body, "seed", int, "an integer"),
        temperature=_number_in(body, "temperature", 0, 2),
        top_p=_number_in(body, "top_p", 0, 1),
        ignore_eos=_flag(body, "ignore_eos"),
        stream=stream,
        include_usage=_include_usage(body, stream),
    )


def check_fits(prompt_tokens: int, wanted: Sampling, context_length: int, api: OpenAIApi) -> None:
    """Refuse, as every engine with its own inference routes does (``FORWARDING_ENGINES``
    aside), an empty prompt and one that leaves no room for the output it asks for."""
    param = "messages" if api.kind == "chat" else "prompt"
    if prompt_tokens == 0:
        raise FieldError(param, "the prompt is empty; give at least one token")
    output = wanted.max_tokens or 1
    if prompt_tokens + output > context_length:
        asked = f"{wanted.max_tokens_name} ({output})" if wanted.max_tokens else "one token"
        raise FieldError(
            param,
            f"the prompt ({prompt_tokens} tokens) plus {asked} exceeds the model's context "
            f"length of {context_length} tokens",
        )


def _optional(body: Json, name: str, kinds: type | tuple[type, ...], what: str) -> Any:
    value = body.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
        raise FieldError(name, f"{name} must be {what}, got {brief(value)}")
    return value


def _flag(body: Json, name: str) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise FieldError(name, f"{name} must be true or false, got {brief(value)}")
    return bool(value)


def _number_in(body: Json, name: str, low: float, high: float) -> float | None:
    value = _optional(body, name, (int, float), "a number")
    if value is not None and not low <= value <= high:
        raise FieldError(name, f"{name} must be between {low:g} and {high:g}, got {value!r}")
    return None if value is None else float(value)


def _include_usage(body: Json, stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise FieldError("stream_options", "stream_options is only allowed when stream is true")
    if not isinstance(options, dict):
        raise FieldError(
            "stream_options", f"stream_options must be an object, got {brief(options)}"
        )
    return _flag(options, "include_usage")


def error_body(status: int, message: str, code: str, param: str | None = None) -> Json:
    if status == 429:
        kind = "rate_limit_error"
    else:
        kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    code: str,
    *,
    param: str | None = None,
    worker_id: str | None = None,
    retry_after: int | None = None,
) -> web.Response:
    """The error answer; ``retry_after`` (seconds) marks it retryable with ``Retry-After``."""
    headers = {WORKER_ID_HEADER: worker_id} if worker_id is not None else {}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    return json_response(error_body(status, message, code, param), status=status, headers=headers)


_REFUSALS = {408: "request_timeout", 413: "request_too_large"}


def openai_refusal(status: int, message: str) -> web.Response:
    """A request the server refuses before any handler (``http/server.py``), in OpenAI's
    error shape."""
    return error_response(status, message, _REFUSALS.get(status, "invalid_request"))


def sse_event(data: Json | str) -> bytes:
    """One server-sent event: ``data: <json or text>`` and the blank line."""
    text = data.encode() if isinstance(data, str) else jsoncodec.write(data)
    return b"data: " + text + b"\n\n"


def error_event(message: str, code: str) -> bytes:
    """One SSE event holding an error, for a stream that breaks after it started."""
    return sse_event(error_body(500, message, code))


@dataclass(frozen=True)
class OpenAIApi:
    """One of the two inference APIs: its metric label, its path, how its prompt becomes
    token ids, and the names its answers carry."""

    route: str
    path: str
    kind: Literal["text", "chat"]
    prompt: Callable[[Json, Tokenizer], tuple[int, ...]]
    object_whole: str
    object_chunk: str
    id_prefix: str

    def new_id(self) -> str:
        return f"{self.id_prefix}-{uuid.uuid4().hex}"


COMPLETIONS = OpenAIApi(
    "completions", "/v1/completions", "text", completion_prompt,
    "text_completion", "text_completion", "cmpl",
)  # fmt: skip
CHAT = OpenAIApi(
    "chat_completions", "/v1/chat/completions", "chat", chat_prompt,
    "chat.completion", "chat.completion.chunk", "chatcmpl",
)  # fmt: skip
API_BY_KIND = {api.kind: api for api in (COMPLETIONS, CHAT)}
