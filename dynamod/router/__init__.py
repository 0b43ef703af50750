"""Routing: the eligibility table, scoring, the pending queue and the router itself.

Nothing here does I/O: the router learns workers from discovery events (``apply``) and
hands out assignments; the caller talks to the worker.
"""

from dynamod.router.groups import Group, LoadOrder
from dynamod.router.knobs import RouterKnobs
from dynamod.router.kvindex import KvIndex, Overlaps
from dynamod.router.prefix import OverlapSource, PrefixIndex, prefix_hashes
from dynamod.router.queue import PendingQueue, Waiter, WaitState
from dynamod.router.router import Router
from dynamod.router.router_metrics import RouterMetrics
from dynamod.router.scoring import CostTerms, cost_terms, probabilities, select
from dynamod.router.table import Ineligible, RoutingTable, why_not
from dynamod.router.types import (
    Assignment,
    Explanation,
    RouteRequest,
    Verdict,
    WorkerExplanation,
)

__all__ = [
    "Assignment",
    "CostTerms",
    "Explanation",
    "Group",
    "Ineligible",
    "KvIndex",
    "LoadOrder",
    "OverlapSource",
    "Overlaps",
    "PendingQueue",
    "PrefixIndex",
    "RouteRequest",
    "Router",
    "RouterKnobs",
    "RouterMetrics",
    "RoutingTable",
    "Verdict",
    "WaitState",
    "Waiter",
    "WorkerExplanation",
    "cost_terms",
    "prefix_hashes",
    "probabilities",
    "select",
    "why_not",
]
