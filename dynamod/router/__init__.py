"""Routing: the eligibility table, scoring, the pending queue and the router itself.

Nothing here does I/O: the router learns workers from discovery events (``apply``) and
hands out assignments; the caller talks to the worker.
"""

from dynamod.router.metrics import RouterMetrics
from dynamod.router.queue import PendingQueue, Waiter, WaitState
from dynamod.router.router import Router
from dynamod.router.scoring import (
    IDLE,
    Busy,
    CostTerms,
    Load,
    PrefixIndex,
    RouterConfig,
    cost_terms,
    hash_blocks,
    probabilities,
    select,
)
from dynamod.router.table import Ineligible, RoutingTable, why_not
from dynamod.router.types import (
    Assignment,
    Explanation,
    Outcome,
    RouteRequest,
    WorkerExplanation,
)

__all__ = [
    "IDLE",
    "Assignment",
    "Busy",
    "CostTerms",
    "Explanation",
    "Ineligible",
    "Load",
    "Outcome",
    "PendingQueue",
    "PrefixIndex",
    "RouteRequest",
    "Router",
    "RouterConfig",
    "RouterMetrics",
    "RoutingTable",
    "WaitState",
    "Waiter",
    "WorkerExplanation",
    "cost_terms",
    "hash_blocks",
    "probabilities",
    "select",
    "why_not",
]
