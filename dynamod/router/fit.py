"""What a request needs of a worker's model card, besides its taints.

The front reads a body once, before routing: it tokenizes the prompt with one tokenizer,
hashes its blocks with one block size, checks its fields only where the model's workers
check bodies, and checks that the prompt and its output fit a context. Each worker
publishes its own card, and the workers of one model may disagree: a rolling upgrade
with another ``max_model_len``, or a hostile record. So no one card decides for the
others:

* a worker's ``Reading`` is how it reads a body: the tokenizer its card names and its
  KV block size. A model's workers are meant to agree on it; the front reads every body
  the way *most* of them do (``ModelReading``; a tie goes to the reading that has been
  there longest) and a request is routed only to workers of that reading. The others are
  *disagreeing* workers: left out of routing, counted and logged by the router, never
  allowed to decide for the rest.
* whether the front checks a body's fields first is not part of a reading: a worker
  whose engine forwards bodies to an upstream that checks them (``--engine openai``
  beside a ``vllm serve``) reads a body as one whose engine runs in process does, and
  the two serve one model side by side. The front checks fields and context only where
  *every* worker of the reading would refuse what those checks refuse
  (``ModelReading.checked``); otherwise each worker refuses for itself what it cannot
  take, and an upstream keeps what it accepts (``n`` > 1, for one).
* a worker's context length is a condition on each request: a worker whose context
  cannot hold the prompt plus its output is not eligible for it. A request no worker of
  the reading can hold is refused by the front (400, naming the largest context there
  is); a small context only costs its own worker the requests it cannot hold.

``CardNeeds`` is what a ``RouteRequest`` asks: a reading (None: any) and a context
*tier* (0: any). The tier is the smallest context among the reading's workers that
holds the request (``ModelReading.tier``), not the request's own token count, so that
requests whose eligible workers are the same share one case in the pending queue
(``queue.py``); it never admits a worker too small for the request.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from dynamod.http.openai import FORWARDING_ENGINES
from dynamod.records import ModelCard
from dynamod.tokenizers.bundle import TokenizerRef


@dataclass(frozen=True, slots=True)
class Reading:
    """How a worker reads a body: ``tokenizer`` (the checksum of the tokenizer bundle its
    card names; ``""`` for a card that names none) and ``block_size`` (its KV block
    size)."""

    tokenizer: str
    block_size: int

    @classmethod
    def of(cls, card: ModelCard) -> Reading:
        ref = TokenizerRef.of(card)
        return cls(ref.checksum if ref is not None else "", card.kv_block_size)

    def describe(self) -> str:
        """``tokenizer sha256:1a2b3c4d…, block size 16``."""
        tokenizer = f"tokenizer {self.tokenizer[:15]}…" if self.tokenizer else "no tokenizer"
        return f"{tokenizer}, block size {self.block_size}"


def forwards(card: ModelCard) -> bool:
    """Whether the card's worker forwards bodies to an upstream that checks them."""
    return card.engine in FORWARDING_ENGINES


@dataclass(frozen=True, slots=True)
class CardNeeds:
    """What a request needs of a worker's card: its ``reading`` (None: any) and a context
    of at least ``context`` tokens (0: any; a tier, see the module docstring). ``tokens``
    is the request's own count, for messages only: it takes no part in equality, so
    requests of one tier are alike."""

    reading: Reading | None = None
    context: int = 0
    tokens: int = field(default=0, compare=False)

    def admits(self, reading: Reading, context_length: int) -> bool:
        """Whether a worker of ``reading`` with ``context_length`` may take the request."""
        return (self.reading is None or self.reading == reading) and context_length >= self.context


ANY = CardNeeds()
"""A request that needs nothing of a card (a wait for any worker)."""


@dataclass(frozen=True)
class ModelReading:
    """How the front reads the bodies of one model, and what its workers offer.

    ``reading``: the one most of its workers publish; ``card``: the card of one of those
    (for its tokenizer); ``contexts``: the distinct context lengths of the workers of that
    reading, ascending; ``workers``: how many publish it; ``disagreeing``: how many of the
    model's workers publish another reading (and are left out of routing); ``checked``:
    none of the reading's workers forwards bodies (``forwards``), so the front checks a
    body's fields and context before routing.
    """

    reading: Reading
    card: ModelCard
    contexts: tuple[int, ...]
    workers: int
    disagreeing: int
    checked: bool

    @property
    def context_length(self) -> int:
        """The largest context of the reading's workers: what the front checks against."""
        return self.contexts[-1]

    def tier(self, tokens: int) -> int:
        """The smallest context of the reading's workers that holds ``tokens`` (prompt
        plus output); ``tokens`` itself when none does (no worker is then eligible)."""
        at = bisect.bisect_left(self.contexts, tokens)
        return self.contexts[at] if at < len(self.contexts) else tokens

    def needs(self, tokens: int) -> CardNeeds:
        """What a request of ``tokens`` (0: not counted) needs of a worker's card."""
        return CardNeeds(self.reading, self.tier(tokens) if tokens > 0 else 0, tokens)
