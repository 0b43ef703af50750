"""``dynamoctl route explain``: the router's decision for a hypothetical request, as data.

The prompt is tokenized with the same deterministic tokenizer the front uses, and its block
hashes computed with the model's KV block size, so prefix overlap shows up exactly as a
real request would see it.
"""

from __future__ import annotations

from dynamod.api.types import CandidateInfo, ExplainInfo
from dynamod.control import Control
from dynamod.router import RouteRequest, WorkerExplanation
from dynamod.taints import RoutingConstraints
from dynamod.worker.tokenizer import SimpleTokenizer

DEFAULT_BLOCK_SIZE = 16


def explain(
    control: Control, model: str, constraints: RoutingConstraints, prompt: str
) -> ExplainInfo:
    tokens = SimpleTokenizer().encode(prompt) if prompt else []
    workers = control.router.table.workers(model)
    block_size = workers[0].model_card.kv_block_size if workers else DEFAULT_BLOCK_SIZE
    request = RouteRequest.for_prompt(model, constraints, tokens, block_size)
    result = control.router.explain(request)
    candidates = tuple(_candidate(control, row) for row in result.workers)
    chosen = next((c.worker.id for c in candidates if c.rank == 1), "")
    summary = result.reason or f"would route to {chosen} ({len(candidates)} workers of {model!r})"
    return ExplainInfo(candidates, chosen, summary)


def _candidate(control: Control, row: WorkerExplanation) -> CandidateInfo:
    terms = row.terms
    if row.ineligible is not None:
        reason = row.ineligible.describe(row.worker).split(" ", 1)[1]
    elif row.busy is not None:
        reason = f"busy ({row.busy.value} at capacity)"
    else:
        reason = ""
    return CandidateInfo(
        worker=control.info(row.worker),
        eligible=row.eligible,
        reason=reason,
        load_cost=terms.load_cost,
        overlap_credit=terms.overlap_credit,
        overlap_blocks=terms.overlap_blocks,
        preference=terms.preference,
        multiplier=terms.multiplier,
        cost=terms.cost,
        rank=row.rank or 0,
    )
