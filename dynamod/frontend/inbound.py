"""Reading an inbound OpenAI request: the little the front needs to route it.

The body is forwarded to the worker as it came, but for one addition: a text or chat
prompt the front tokenized travels on as ``nvext.token_ids`` with ``nvext.tokenizer`` (the
checksum of the tokenizer used; ``http.openai.forwarded_ids`` says how the worker takes
them). The worker validates everything else itself; its 400 answers are passed on. The
front reads only:

* ``model``: a non-empty string (read first: it names the tokenizer to use);
* the prompt: ``prompt`` for completions (a string or a list of token ids, or a list
  holding one of those), ``messages`` for chat, rendered with the chat template of the
  model's own tokenizer exactly as the worker renders them, so the prompt's token count
  and KV block hashes are the ones the worker will see;
* ``nvext.routing_constraints``: ``RoutingConstraints.from_json`` (an unknown key is
  refused and named);
* ``nvext.max_wait``: seconds this request may wait for a worker (the router's limits
  otherwise). Other ``nvext`` keys are left to the worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from dynamod.errors import ConstraintError
from dynamod.http.openai import (
    FieldError,
    Json,
    OpenAIApi,
    brief,
    json_object,
    model_of,
    with_forwarded_ids,
)
from dynamod.router import RouteRequest
from dynamod.taints import RoutingConstraints
from dynamod.tokenizers import Tokenizer


@dataclass(frozen=True)
class Body:
    """A request body, read and checked, before its prompt is tokenized."""

    api: OpenAIApi
    raw: bytes
    json: Json
    model: str
    constraints: RoutingConstraints
    max_wait: float | None

    def tokenized(self, tokenizer: Tokenizer) -> Inbound:
        """The request with its prompt's token ids, and the body to forward carrying them
        when the front tokenized text; raises ``FieldError``."""
        prompt = self.api.prompt(self.json, tokenizer)
        raw = self.raw
        if _text_prompt(self.api, self.json):
            raw = with_forwarded_ids(self.json, prompt, tokenizer)
        return Inbound(self.api, raw, self.model, prompt, self.constraints, self.max_wait)


def _text_prompt(api: OpenAIApi, body: Json) -> bool:
    """Whether the prompt was text (a token-id prompt already is what the worker needs)."""
    if api.kind == "chat":
        return True
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return isinstance(prompt, str)


@dataclass(frozen=True)
class Inbound:
    """A request, read: the body to forward and what routing needs from it."""

    api: OpenAIApi
    raw: bytes
    model: str
    prompt_ids: tuple[int, ...]
    constraints: RoutingConstraints
    max_wait: float | None

    def route_request(self, block_size: int) -> RouteRequest:
        """The router's request, with block hashes for a model of ``block_size``."""
        return RouteRequest.for_prompt(
            self.model, self.constraints, self.prompt_ids, block_size, self.max_wait
        )


async def read_body(request: web.Request, api: OpenAIApi) -> Body:
    """Read and check the body of ``request`` but its prompt; raises ``FieldError``."""
    raw = await request.read()  # read in time and bounded before any handler: http/server.py
    body = json_object(raw)
    model = model_of(body)
    constraints, max_wait = _nvext(body.get("nvext"))
    return Body(api, raw, body, model, constraints, max_wait)


def _nvext(nvext: object) -> tuple[RoutingConstraints, float | None]:
    if nvext is None:
        return RoutingConstraints(), None
    if not isinstance(nvext, dict):
        raise FieldError("nvext", f"nvext must be a JSON object, got {brief(nvext)}")
    try:
        constraints = RoutingConstraints.from_json(nvext.get("routing_constraints"))
    except ConstraintError as exc:
        raise FieldError("nvext.routing_constraints", str(exc)) from None
    return constraints, _max_wait(nvext.get("max_wait"))


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
