"""Reading an inference request before it is routed: pure functions, run on the event loop
for a small body and in a prompt process for a large one (``processes.py``).

Two steps, because the tokenizer to use depends on the model the body names:

1. ``read_head(body)``: what the front needs before it knows the model's card: ``model``,
   ``nvext.routing_constraints`` (``RoutingConstraints.from_json``, an unknown key
   refused and named) and ``nvext.max_wait`` (seconds the request may wait for a worker).
   Other ``nvext`` keys are the worker's.
2. ``read_prompt(body, raw, api, tokenizer, model)``: once the model's card and tokenizer
   are known. Where no worker of the model forwards bodies to an upstream that checks
   them (``CardLimits.checked``, from ``router.fit.ModelReading.checked``) the body's
   fields get the very checks the worker makes (``sampling``), and the prompt must fit
   the context (``check_fits``): the front refuses what a worker would, before routing.
   Then the prompt's token ids (``api.prompt``: the model's chat template for a chat),
   the body to forward (a text or chat prompt's ids travel on as ``nvext.token_ids``, so
   the worker need not tokenize again: ``http.openai``), and the chained hashes of its KV
   blocks (``router.prefix.prefix_hashes``).

``tokenize_text(text, tokenizer, block_size)`` is the same for ``explain``: a bare
prompt's token count and block hashes. Every function raises ``FieldError`` (or, for
``tokenize_text``, ``InvalidInputError``) with the reason; every result pickles, for the
worker processes.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynamod.errors import ConstraintError
from dynamod.http.openai import (
    FieldError,
    OpenAIApi,
    brief,
    check_fits,
    model_of,
    sampling,
    with_forwarded_ids,
)
from dynamod.jsoncodec import Json
from dynamod.router.prefix import prefix_hashes
from dynamod.taints import RoutingConstraints
from dynamod.tokenizers import Tokenizer


@dataclass(frozen=True)
class Head:
    """What a body says before its model's tokenizer is known."""

    model: str
    constraints: RoutingConstraints
    max_wait: float | None


@dataclass(frozen=True)
class CardLimits:
    """What preparing a body needs to know of its model's card."""

    block_size: int
    context_length: int
    checked: bool
    """Whether the model's workers check bodies themselves, so the front checks first."""
    name: str = ""
    """The model's name, for the messages that blame the model rather than the request."""


@dataclass(frozen=True)
class ReadyRequest:
    """A request ready to route: the body to forward, and what routing counts."""

    raw: bytes
    prompt_tokens: int
    block_hashes: tuple[int, ...]
    context_tokens: int = 0
    """The context a worker needs for it: the prompt plus the output it asks for (one token
    when ``max_tokens`` is unset), where the model's workers check bodies; else 0."""


@dataclass(frozen=True)
class Tokenized:
    """A bare prompt, as ``explain`` reads it."""

    prompt_tokens: int
    block_hashes: tuple[int, ...]


_UNCONSTRAINED = RoutingConstraints()
"""The constraints of a body without ``nvext``: one value for all of them (it is frozen)."""


def read_head(body: Json) -> Head:
    """``model`` and ``nvext`` of a parsed body; raises ``FieldError``."""
    model = model_of(body)
    nvext = body.get("nvext")
    if nvext is None:
        return Head(model, _UNCONSTRAINED, None)
    if not isinstance(nvext, dict):
        raise FieldError("nvext", f"nvext must be a JSON object, got {brief(nvext)}")
    try:
        constraints = RoutingConstraints.from_json(nvext.get("routing_constraints"))
    except ConstraintError as exc:
        raise FieldError("nvext.routing_constraints", str(exc)) from None
    return Head(model, constraints, _max_wait(nvext.get("max_wait")))


def _max_wait(value: object) -> float | None:
    if value is None:
        return None
    # JSON true/false are not numbers, although Python's bool subclasses int; a JSON integer
    # may also be too large for a float.
    if not isinstance(value, bool) and isinstance(value, int | float) and 0 <= value < 1e9:
        return float(value)
    raise FieldError(
        "nvext.max_wait",
        f"nvext.max_wait must be a number of seconds from 0 to 1e9; got {brief(value)}",
    )


def read_prompt(
    body: Json, raw: bytes, api: OpenAIApi, tokenizer: Tokenizer, model: CardLimits
) -> ReadyRequest:
    """The body checked as the model's workers check it, tokenized, and ready to forward;
    ``raw`` is the body as it came (forwarded as it is when the prompt was token ids)."""
    wanted = sampling(body, api) if model.checked else None
    ids = api.prompt(body, tokenizer)
    needs = 0
    if wanted is not None:
        check_fits(len(ids), wanted, model.context_length, api)
        needs = len(ids) + (wanted.max_tokens or 1)
    if _text_prompt(api, body):
        raw = with_forwarded_ids(body, ids, tokenizer, raw)
    return ReadyRequest(raw, len(ids), prefix_hashes(ids, model.block_size), needs)


def _text_prompt(api: OpenAIApi, body: Json) -> bool:
    """Whether the prompt was text (a token-id prompt already is what the worker needs)."""
    if api.kind == "chat":
        return True
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return isinstance(prompt, str)


def tokenize_text(text: str, tokenizer: Tokenizer, block_size: int) -> Tokenized:
    """A bare prompt's token count and block hashes, as a request of it would have."""
    ids = tokenizer.encode(text) if text else []
    return Tokenized(len(ids), prefix_hashes(ids, block_size))
