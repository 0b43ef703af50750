"""What goes into the router and what comes out: requests, assignments, explanations."""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from dynamod.errors import InvalidInputError
from dynamod.load import Busy, Load
from dynamod.records import WorkerRecord
from dynamod.router.fit import ANY, CardNeeds
from dynamod.router.prefix import APPROXIMATE
from dynamod.router.scoring import CostTerms
from dynamod.router.table import Ineligible
from dynamod.taints import RoutingConstraints


@dataclass(frozen=True)
class RouteRequest:
    """One request to route.

    ``block_hashes``: chained hashes of the prompt's blocks (``prefix.prefix_hashes`` with
    the model's KV block size), for prefix reuse. ``max_wait``: seconds this request may
    wait, replacing the router's limits. ``exclude``: worker keys (``WorkerRecord.key``)
    not to use, e.g. the worker a first attempt failed on. ``needs``: what the request
    needs of a worker's card, its reading and context (``fit.py``; ``ANY`` by default).
    """

    model: str
    constraints: RoutingConstraints = field(default_factory=RoutingConstraints)
    prompt_tokens: int = 0
    block_hashes: Sequence[int] = ()
    max_wait: float | None = None
    exclude: Collection[str] = ()
    needs: CardNeeds = ANY

    def __post_init__(self) -> None:
        if self.prompt_tokens < 0:
            raise InvalidInputError(f"prompt_tokens must be at least 0, got {self.prompt_tokens}")
        if self.max_wait is not None and not self.max_wait >= 0:
            raise InvalidInputError(f"max_wait must be at least 0 seconds, got {self.max_wait}")
        if isinstance(self.exclude, str):
            raise InvalidInputError(
                f"exclude must be a collection of worker keys, not the string {self.exclude!r}"
            )
        object.__setattr__(self, "block_hashes", tuple(self.block_hashes))
        object.__setattr__(self, "exclude", frozenset(self.exclude))


@dataclass(frozen=True)
class Assignment:
    """A worker chosen for one request, held until ``Router.release``."""

    worker: WorkerRecord
    waited: float
    """Seconds the request spent in the pending queue; 0.0 when assigned at once."""
    terms: CostTerms
    """The chosen worker's cost terms at the moment of the decision."""
    ticket: int = field(repr=False, compare=False)
    """Names the load the router holds for this assignment (its own bookkeeping)."""


class Verdict(enum.Enum):
    """What ``route`` would do with a request right now."""

    ROUTE = "route"
    QUEUE = "queue"
    NO_WORKER = "no_worker"


@dataclass(frozen=True)
class WorkerExplanation:
    """One worker of the model, as the router sees it for one request."""

    worker: WorkerRecord
    ineligible: Ineligible | None
    busy: Busy | None
    load: Load
    terms: CostTerms
    overlap_source: str = APPROXIMATE
    """Where the overlap comes from: ``"kv"`` (the engine's KV events) or
    ``"approximate"`` (what this router sent it)."""
    rank: int | None = None
    """1 for the cheapest candidate; ``None`` for a worker that is ineligible or busy."""
    probability: float = 0.0
    """The chance ``route`` picks this worker now."""

    @property
    def eligible(self) -> bool:
        return self.ineligible is None


@dataclass(frozen=True)
class Explanation:
    """The routing computation for one request, without routing it.

    ``workers``: candidates by rank, then busy eligible workers, then ineligible ones.
    ``reason``: why it would not route at once ("" when it would).
    """

    request: RouteRequest
    outcome: Verdict
    workers: tuple[WorkerExplanation, ...]
    reason: str
    queue_depth: int
