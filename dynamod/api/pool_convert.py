"""Between the daemon's pool reports (``dynamod/pool_results.py``) and the wire messages,
both directions, as ``convert.py`` for the rest."""

from __future__ import annotations

import json
from typing import cast

from dynamod.api.v1 import dynamo_pb2 as pb
from dynamod.pool_results import (
    ApplyKind,
    ApplyOutcome,
    DriftSeen,
    MoveFailure,
    PolicyInfo,
    PoolCount,
    PoolEventInfo,
    PoolEventKind,
    PoolMove,
    PoolStatusInfo,
    RemoveOutcome,
)


def policy_to_pb(info: PolicyInfo) -> pb.Policy:
    document = json.dumps(dict(info.document), sort_keys=True)
    return pb.Policy(
        name=info.name, revision=info.revision, document_json=document, retired=info.retired
    )


def policy_from_pb(message: pb.Policy) -> PolicyInfo:
    document = json.loads(message.document_json) if message.document_json else {}
    return PolicyInfo(message.name, message.revision, document, tuple(message.retired))


def move_to_pb(move: PoolMove) -> pb.PoolMove:
    return pb.PoolMove(**move.__dict__)


def move_from_pb(message: pb.PoolMove) -> PoolMove:
    return PoolMove(
        message.worker, message.from_pool, message.to_pool, message.why, message.time,
        message.epoch, message.revision, message.leader, message.reconciled,
    )  # fmt: skip


def drift_to_pb(drift: DriftSeen) -> pb.PoolDrift:
    return pb.PoolDrift(**{**drift.__dict__, "held": list(drift.held)})


def drift_from_pb(message: pb.PoolDrift) -> DriftSeen:
    return DriftSeen(
        message.worker, tuple(message.held), message.assigned, message.revision, message.time,
        message.action,
    )  # fmt: skip


def apply_to_pb(outcome: ApplyOutcome) -> pb.ApplyPolicyResponse:
    return pb.ApplyPolicyResponse(
        policy=policy_to_pb(outcome.policy),
        outcome=outcome.outcome,
        moves=[move_to_pb(m) for m in outcome.moves],
        dry_run=outcome.dry_run,
    )


def apply_from_pb(message: pb.ApplyPolicyResponse) -> ApplyOutcome:
    return ApplyOutcome(
        policy_from_pb(message.policy),
        cast(ApplyKind, message.outcome),
        tuple(move_from_pb(m) for m in message.moves),
        message.dry_run,
    )


def remove_to_pb(outcome: RemoveOutcome) -> pb.RemovePolicyResponse:
    return pb.RemovePolicyResponse(
        policy=policy_to_pb(outcome.policy), workers_holding=outcome.workers_holding
    )


def remove_from_pb(message: pb.RemovePolicyResponse) -> RemoveOutcome:
    return RemoveOutcome(policy_from_pb(message.policy), message.workers_holding)


def status_to_pb(status: PoolStatusInfo) -> pb.PoolStatusResponse:
    message = pb.PoolStatusResponse(
        policy=policy_to_pb(status.policy),
        replica=status.replica,
        leader=status.leader,
        epoch=status.epoch,
        leading=status.leading,
        workers=status.workers,
        pools=[count_to_pb(c) for c in status.pools],
        by_domain=[
            pb.DomainCount(domain=domain, pool=pool, wanted=wanted)
            for domain, pools in status.by_domain.items()
            for pool, wanted in pools.items()
        ],
        pending=[move_to_pb(m) for m in status.pending],
        excluded=status.excluded,
        recent=[move_to_pb(m) for m in status.recent],
        drift=[drift_to_pb(d) for d in status.drift],
        conflict=status.conflict,
        failing=[pb.PoolFailure(**f.__dict__) for f in status.failing],
    )
    if status.budget_left is not None:
        message.budget_left = status.budget_left
    return message


def count_to_pb(count: PoolCount) -> pb.PoolCount:
    message = pb.PoolCount(
        pool=count.pool, weight=count.weight, wanted=count.wanted, actual=count.actual
    )
    if count.demand is not None:
        message.demand = count.demand
    if count.want is not None:
        message.want = count.want
    return message


def count_from_pb(message: pb.PoolCount) -> PoolCount:
    return PoolCount(
        message.pool, message.weight, message.wanted, message.actual,
        message.demand if message.HasField("demand") else None,
        message.want if message.HasField("want") else None,
    )  # fmt: skip


def status_from_pb(message: pb.PoolStatusResponse) -> PoolStatusInfo:
    by_domain: dict[str, dict[str, int]] = {}
    for cell in message.by_domain:
        by_domain.setdefault(cell.domain, {})[cell.pool] = cell.wanted
    return PoolStatusInfo(
        policy=policy_from_pb(message.policy),
        replica=message.replica,
        leader=message.leader,
        epoch=message.epoch,
        leading=message.leading,
        workers=message.workers,
        pools=tuple(count_from_pb(c) for c in message.pools),
        by_domain=by_domain,
        pending=tuple(move_from_pb(m) for m in message.pending),
        excluded=tuple(message.excluded),
        recent=tuple(move_from_pb(m) for m in message.recent),
        drift=tuple(drift_from_pb(d) for d in message.drift),
        budget_left=message.budget_left if message.HasField("budget_left") else None,
        conflict=message.conflict,
        failing=tuple(
            MoveFailure(f.worker, f.to_pool, f.error, f.attempts, f.next_time, f.refused)
            for f in message.failing
        ),
    )


def pool_event_to_pb(info: PoolEventInfo) -> pb.PoolEvent:
    return pb.PoolEvent(**{**info.__dict__, "held": list(info.held)})


def pool_event_from_pb(message: pb.PoolEvent) -> PoolEventInfo:
    return PoolEventInfo(
        cast(PoolEventKind, message.kind), message.policy, message.worker, message.from_pool,
        message.to_pool, message.why, message.epoch, message.leader, tuple(message.held),
        message.message,
    )  # fmt: skip
