"""An inbound OpenAI request, read: what the front forwards and what it routes by.

The body is forwarded to the worker as it came, but for one addition: a text or chat
prompt the front tokenized travels on as ``nvext.token_ids`` with ``nvext.tokenizer`` (the
checksum of the tokenizer used; ``http.openai.forwarded_ids`` says how the worker takes
them). Reading it (``prompts.prepare``, on the loop or in a prompt worker process:
``prompts.reader``) checks what the model's workers would check: ``model``, the prompt
(``prompt`` for completions, ``messages`` for chat, rendered with the chat template of the
model's own tokenizer exactly as the worker renders them), the sampling fields
(``http.openai.sampling``), that the prompt fits the model's context, and ``nvext``:
``routing_constraints`` (``RoutingConstraints.from_json``, an unknown key refused and
named) and ``max_wait`` (seconds this request may wait for a worker). Other ``nvext`` keys
are left to the worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynamod.http.openai import OpenAIApi
from dynamod.prompts.body import Head, Routable
from dynamod.router import RouteRequest
from dynamod.router.fit import CardNeeds


@dataclass(frozen=True)
class Inbound:
    """A request, read: the body to forward and what routing needs from it."""

    api: OpenAIApi
    raw: bytes
    route: RouteRequest

    @classmethod
    def of(cls, api: OpenAIApi, head: Head, routable: Routable, needs: CardNeeds) -> Inbound:
        """``needs``: what the request needs of a worker's card (``router.fit``)."""
        route = RouteRequest(
            head.model,
            head.constraints,
            routable.prompt_tokens,
            routable.block_hashes,
            head.max_wait,
            needs=needs,
        )
        return cls(api, routable.raw, route)
