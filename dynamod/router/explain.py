"""What ``route`` would do now, worker by worker, with every cost term: ``route explain``.

Brute force on purpose: it is the operator's view of every worker of a model, and the
oracle the fast path (``choice.py``) is tested against. Each worker gets a row: why it is
not eligible (``table.why_not``), why it is busy, its load here and the cost terms a
decision would use; eligible free workers are ranked by cost, each with its chance of
being picked (at temperature > 0 only the ``sample_candidates`` cheapest have one).

On an NVIDIA Dynamo fleet the decision is Dynamo's frontend's, not this router's:
``by_dynamo_rule`` keeps what is Dynamo's rule (which workers are eligible: every
required taint held, an endpoint it can reach; the cordon means nothing there) and marks
the rest as dynamod's guess (the ranking: Dynamo picks by load and KV cache state that
dynamod never sees); ``dynamo_summary`` says so in words.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Protocol

from dynamod.load import Busy, Load
from dynamod.records import WorkerRecord
from dynamod.router.knobs import RouterKnobs
from dynamod.router.prefix import OverlapSource
from dynamod.router.scoring import CostTerms, cost_terms, probabilities
from dynamod.router.table import Ineligible, RoutingTable, why_not
from dynamod.router.types import Explanation, RouteRequest, Verdict, WorkerExplanation
from dynamod.taints import preference


class Explained(Protocol):
    """What an explanation reads of the router."""

    knobs: RouterKnobs

    @property
    def table(self) -> RoutingTable: ...

    @property
    def prefix(self) -> OverlapSource: ...

    def load(self, key: str) -> Load: ...

    def busy(self, worker: WorkerRecord) -> Busy | None: ...

    def overlaps(self, request: RouteRequest) -> dict[str, int]: ...

    def depth(self, model: str) -> int: ...

    def unsatisfiable(self, request: RouteRequest) -> str: ...

    def busy_message(self, request: RouteRequest) -> str: ...


def explain(router: Explained, request: RouteRequest) -> Explanation:
    """The router's decision for ``request`` now, and every worker's part in it."""
    overlaps = router.overlaps(request)
    rows = [_row(router, request, w, overlaps) for w in router.table.workers(request.model)]
    ranked = _ranked(router.knobs, [r for r in rows if r.eligible and r.busy is None])
    rest = sorted(
        (r for r in rows if not (r.eligible and r.busy is None)),
        key=lambda r: (not r.eligible, r.worker.key),
    )
    if ranked:
        outcome, reason = Verdict.ROUTE, ""
    elif any(r.eligible for r in rows):
        outcome, reason = Verdict.QUEUE, router.busy_message(request)
    else:
        outcome, reason = Verdict.NO_WORKER, router.unsatisfiable(request)
    return Explanation(request, outcome, (*ranked, *rest), reason, router.depth(request.model))


def _row(
    router: Explained, request: RouteRequest, worker: WorkerRecord, overlaps: dict[str, int]
) -> WorkerExplanation:
    load = router.load(worker.key)
    why = why_not(worker, request.constraints, request.exclude, request.needs)
    terms = _terms(router.knobs, request, worker, load, overlaps.get(worker.key, 0))
    source = router.prefix.source(worker.key)
    return WorkerExplanation(worker, why, router.busy(worker), load, terms, source)


def _terms(
    knobs: RouterKnobs, request: RouteRequest, worker: WorkerRecord, load: Load, overlap: int
) -> CostTerms:
    constraints = request.constraints
    weight = preference(worker.taints, constraints) if constraints.preferred_taints else 0.0
    return cost_terms(
        knobs,
        worker.model_card.kv_block_size,
        load,
        prompt_tokens=request.prompt_tokens,
        overlap_blocks=overlap,
        preference=weight,
    )


def _ranked(knobs: RouterKnobs, rows: Iterable[WorkerExplanation]) -> list[WorkerExplanation]:
    """Candidates by cost, each with its chance of being picked: at temperature > 0 only
    the ``sample_candidates`` cheapest have one (``choice.py``)."""
    order = sorted(rows, key=lambda r: r.terms.cost)
    sampled = order if knobs.temperature == 0.0 else order[: knobs.sample_candidates]
    chances = probabilities([r.terms.cost for r in sampled], knobs.temperature)
    chances += [0.0] * (len(order) - len(sampled))
    return [
        replace(row, rank=n, probability=chance)
        for n, (row, chance) in enumerate(zip(order, chances, strict=True), 1)
    ]


DYNAMO_RULE = "every required taint held; Dynamo does not honour the cordon"
"""NVIDIA Dynamo 1.6.1's eligibility rule for a request, in words."""


def by_dynamo_rule(explanation: Explanation) -> Explanation:
    """``explanation`` as NVIDIA Dynamo's frontend would decide it, as far as a third party
    can tell. Eligible is Dynamo's rule (``DYNAMO_RULE``) on a worker it can reach (one
    that is unhealthy here is unreachable: dynamod's own check); dynamod's card checks and
    this router's load do not apply. The rank is dynamod's cost on its own figures (no
    load data from Dynamo), a guess: no chance of being picked is claimed."""
    required = explanation.request.constraints.required_taints
    rows = []
    for row in explanation.workers:
        missing = tuple(sorted(required - set(row.worker.taints)))
        busy = row.busy if row.busy is Busy.UNHEALTHY else None
        ineligible = Ineligible(missing) if missing else None
        rows.append(replace(row, ineligible=ineligible, busy=busy, rank=None, probability=0.0))
    free = sorted((r for r in rows if r.eligible and r.busy is None), key=lambda r: r.terms.cost)
    ranked = [replace(row, rank=n) for n, row in enumerate(free, 1)]
    rest = sorted(
        (r for r in rows if not (r.eligible and r.busy is None)),
        key=lambda r: (not r.eligible, r.worker.key),
    )
    outcome = Verdict.ROUTE if ranked else Verdict.NO_WORKER
    return replace(explanation, outcome=outcome, workers=(*ranked, *rest), reason="")


def dynamo_summary(explanation: Explanation) -> tuple[str, str]:
    """The worker Dynamo's frontend would route to, when its rule alone decides ("" when
    it picks among several, or refuses), and what an explanation by ``by_dynamo_rule``
    means, in words: which part is Dynamo's rule and which dynamod's guess."""
    model = explanation.request.model
    constraints = explanation.request.constraints.describe()
    candidates = [r.worker.instance_id for r in explanation.workers if r.rank]
    if not explanation.workers:
        refused = "NVIDIA Dynamo's frontend would refuse it at once (500)"
        return "", f"{refused}: no worker serves {model!r}"
    if not candidates:
        return "", (
            f"NVIDIA Dynamo's frontend would refuse it at once (500): by Dynamo's rule "
            f"({DYNAMO_RULE}) no worker of {model!r} it can reach takes {constraints}"
        )
    if len(candidates) == 1:
        return candidates[0], (
            f"NVIDIA Dynamo's frontend would route to {candidates[0]}, the one worker of "
            f"{model!r} that Dynamo's rule allows ({DYNAMO_RULE})"
        )
    return "", (
        f"NVIDIA Dynamo's frontend would route to one of these {len(candidates)} workers of "
        f"{model!r}: Dynamo's rule ({DYNAMO_RULE}). Which one is Dynamo's choice, by load "
        "and KV cache state dynamod does not see: the rank and costs are dynamod's guess "
        "(only the preference multiplier, exp(-tanh(sum of weights)), is Dynamo's formula)"
    )
