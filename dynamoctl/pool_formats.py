"""What the ``pools`` commands show, and pool events in ``events tail``: the daemon's pool
reports turned into table rows, ``describe``-style lines and the objects of ``-o json`` /
``-o yaml``. Pure functions; no I/O.

The JSON shapes are an interface for scripts: keys are only ever added.

* a policy: ``name``, ``revision``, ``selector``, ``pools`` (taint -> weight), ``paused``,
  ``retired`` (pool taints of replaced versions, stripped by the leader) and ``policy``
  (the document as stored: what ``pools apply -f`` takes back);
* a move: ``worker``, ``from`` (null when the worker held none or several of the
  policy's pools), ``to``, ``why`` (joined, fixup, drift, rebalance, demand, retired) and, once
  made, ``time`` (RFC 3339), ``epoch``, ``revision``, ``leader`` (null while pending);
* ``pools apply``: ``name``, ``outcome`` (created, changed, unchanged), ``revision``,
  ``dry_run``, ``policy`` (a policy object), ``moves`` (planned by the answering daemon);
* ``pools status``: ``name``, ``policy``, ``replica`` (the daemon that answered),
  ``leader`` and ``epoch`` (null and 0 when nobody leads), ``leading``, ``workers``,
  ``balanced``, ``pools`` (each ``pool``, ``weight``, ``target``, ``actual``),
  ``by_domain`` (domain value -> pool -> target, with ``spread_by``), ``pending``,
  ``excluded`` (owned workers not routable), ``recent`` (moves the leader made, newest
  last), ``drift`` (each ``worker``, ``held``, ``assigned``, ``revision``, ``time``,
  ``action``), ``budget_left`` (null without a budget or on a follower), ``conflict``
  (null unless the policy overlaps another and is not reconciled), ``failing`` (the
  leader's failed moves: each ``worker``, ``to``, ``error``, ``attempts``,
  ``next_attempt`` (RFC 3339; null when ``refused``: tried again only once the policy,
  the worker or the daemon's settings change), ``refused``);
* ``pools rm``: ``name``, ``removed`` (true), ``workers_holding``, ``policy``;
* an event of ``events tail`` whose ``event`` is ``POOL`` has ``pool``: ``kind``,
  ``policy``, ``worker``, ``from``, ``to``, ``why``, ``epoch``, ``leader``, ``held``,
  ``message`` (empty fields null).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dynamoctl.formats import NONE, SHORT_ID, iso_time, joined, short_ids, taints_text

if TYPE_CHECKING:
    from dynamod.pool_results import (
        ApplyOutcome,
        DriftSeen,
        MoveFailure,
        PolicyInfo,
        PoolEventInfo,
        PoolMove,
        PoolStatusInfo,
        RemoveOutcome,
    )
    from dynamod.reports import EventInfo

POLICY_HEADERS = ("NAME", "SELECTOR", "POOLS", "PAUSED", "REVISION")
POLICY_WIDE_HEADERS = (*POLICY_HEADERS, "OPTIONS", "RETIRED")
MOVE_HEADERS = ("WORKER", "FROM", "TO", "WHY")
MADE_HEADERS = ("TIME", "WORKER", "FROM", "TO", "WHY", "EPOCH", "REVISION")
COUNT_HEADERS = ("POOL", "WEIGHT", "TARGET", "ACTUAL")
ELASTIC_HEADERS = ("POOL", "WEIGHT", "DEMAND", "WANT", "TARGET", "ACTUAL")
"""An elastic policy's pools: its demand (in flight plus waiting) and what that wants."""
DRIFT_HEADERS = ("TIME", "WORKER", "HELD", "ASSIGNED", "REVISION", "ACTION")
FAILING_HEADERS = ("WORKER", "TO", "ATTEMPTS", "NEXT ATTEMPT", "ERROR")
REFUSED = "after a change"
"""The next attempt of a refused move: once the policy, the worker or the settings change."""
OPTIONS = ("min_per_pool", "max_moves", "move_interval", "spread_by")


def number(value: float) -> str:
    """A weight as written: 40, not 40.0."""
    return str(int(value)) if float(value).is_integer() else str(value)


def pools_text(pools: dict[str, float]) -> str:
    return ",".join(f"{taint}:{number(weight)}" for taint, weight in pools.items()) or NONE


def options_text(info: PolicyInfo) -> str:
    shown = [f"{key}={info.document[key]}" for key in OPTIONS if key in info.document]
    elastic = info.document.get("elastic")
    if isinstance(elastic, dict):
        shown.append(f"elastic=({elastic_text(elastic)})")
    return ",".join(shown) or NONE


def policy_row(info: PolicyInfo, wide: bool) -> list[str]:
    row = [info.name, info.selector, pools_text(info.pools), yes_no(info.paused),
           str(info.revision)]  # fmt: skip
    if wide:
        row += [options_text(info), joined(info.retired)]
    return row


def yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def policy_object(info: PolicyInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "revision": info.revision,
        "selector": info.selector,
        "pools": info.pools,
        "paused": info.paused,
        "retired": list(info.retired),
        "policy": dict(info.document),
    }


def policy_details(info: PolicyInfo) -> list[tuple[str, str]]:
    return [
        ("Name", info.name),
        ("Selector", info.selector),
        ("Pools", pools_text(info.pools)),
        ("Options", options_text(info)),
        ("Paused", yes_no(info.paused)),
        ("Retired", joined(info.retired)),
        ("Revision", str(info.revision)),
    ]


def move_object(move: PoolMove) -> dict[str, Any]:
    made = bool(move.time)
    return {
        "worker": move.worker,
        "from": move.from_pool or None,
        "to": move.to_pool,
        "why": move.why,
        "time": iso_time(move.time) if made else None,
        "epoch": move.epoch if made else None,
        "revision": move.revision if made else None,
        "leader": move.leader if made else None,
        **({"reconciled": move.reconciled} if move.reconciled else {}),
    }


def move_rows(moves: Sequence[PoolMove], id_prefix: int = SHORT_ID) -> list[list[str]]:
    """Ids cut to ``id_prefix`` at least (``AsyncClient.id_prefix``, as below)."""
    shorts = short_ids((m.worker for m in moves), id_prefix)
    return [[shorts[m.worker], m.from_pool or NONE, m.to_pool, m.why] for m in moves]


def made_rows(moves: Sequence[PoolMove], id_prefix: int = SHORT_ID) -> list[list[str]]:
    shorts = short_ids((m.worker for m in moves), id_prefix)
    return [
        [
            iso_time(m.time),
            shorts[m.worker],
            m.from_pool or NONE,
            m.to_pool,
            f"{m.why}, reconciled" if m.reconciled else m.why,
            str(m.epoch),
            str(m.revision),
        ]
        for m in moves
    ]


def drift_object(drift: DriftSeen) -> dict[str, Any]:
    return {
        "worker": drift.worker,
        "held": list(drift.held),
        "assigned": drift.assigned,
        "revision": drift.revision,
        "time": iso_time(drift.time),
        "action": drift.action,
    }


def drift_rows(drift: Sequence[DriftSeen], id_prefix: int = SHORT_ID) -> list[list[str]]:
    shorts = short_ids((d.worker for d in drift), id_prefix)
    return [
        [
            iso_time(d.time),
            shorts[d.worker],
            taints_text(d.held),
            d.assigned,
            str(d.revision),
            d.action,
        ]
        for d in drift
    ]


def failure_object(failure: MoveFailure) -> dict[str, Any]:
    return {
        "worker": failure.worker,
        "to": failure.to_pool,
        "error": failure.error,
        "attempts": failure.attempts,
        "next_attempt": None if failure.refused else iso_time(failure.next_time),
        "refused": failure.refused,
    }


def failing_rows(failing: Sequence[MoveFailure]) -> list[list[str]]:
    shorts = short_ids(f.worker for f in failing)
    return [
        [
            shorts[f.worker],
            f.to_pool,
            str(f.attempts),
            REFUSED if f.refused else iso_time(f.next_time),
            f.error,
        ]
        for f in failing
    ]


def apply_summary(outcome: ApplyOutcome) -> str:
    """``policy split created (revision 7): 10 moves planned``; a dry run says would."""
    info = outcome.policy
    count = len(outcome.moves)
    planned = f"{count} move{'' if count == 1 else 's'} planned"
    if outcome.dry_run:
        verb = {"created": "would be created", "changed": "would be changed"}.get(
            outcome.outcome, "is unchanged"
        )
        return f"policy {info.name} {verb} (dry run, nothing written): {planned}"
    return f"policy {info.name} {outcome.outcome} (revision {info.revision}): {planned}"


def apply_object(outcome: ApplyOutcome) -> dict[str, Any]:
    return {
        "name": outcome.policy.name,
        "outcome": outcome.outcome,
        "revision": outcome.policy.revision,
        "dry_run": outcome.dry_run,
        "policy": policy_object(outcome.policy),
        "moves": [move_object(m) for m in outcome.moves],
    }


def remove_summary(outcome: RemoveOutcome) -> str:
    count = outcome.workers_holding
    workers = f"{count} worker{'' if count == 1 else 's'}"
    return (
        f"policy {outcome.policy.name} removed; its pool taints stay as they are on "
        f"{workers} (removing a policy changes no taint)"
    )


def remove_object(outcome: RemoveOutcome) -> dict[str, Any]:
    return {
        "name": outcome.policy.name,
        "removed": True,
        "workers_holding": outcome.workers_holding,
        "policy": policy_object(outcome.policy),
    }


def leader_text(status: PoolStatusInfo) -> str:
    if not status.leader:
        return "nobody leads now (a daemon takes over within the lease's TTL)"
    who = "this daemon" if status.leading else f"answered by {status.replica}"
    return f"{status.leader} (epoch {status.epoch}; {who})"


def status_details(status: PoolStatusInfo) -> list[tuple[str, str]]:
    info = status.policy
    pending = len(status.pending)
    balanced = (
        "yes" if status.balanced else f"no: {pending} move{'' if pending == 1 else 's'} pending"
    )
    if status.failing:
        balanced += f", {len(status.failing)} failing (see Failing moves)"
    budget = (
        "unlimited (no move budget set)"
        if status.budget_left is None
        else f"{status.budget_left} moves left now"
    )
    pairs = [
        ("Name", info.name),
        ("Selector", info.selector),
        ("Pools", pools_text(info.pools)),
        ("Paused", yes_no(info.paused)),
        ("Revision", str(info.revision)),
        ("Leader", leader_text(status)),
        ("Workers", f"{status.workers} owned, {len(status.excluded)} not routable"),
        ("Balanced", balanced),
        ("Budget", budget),
    ]
    elastic = info.document.get("elastic")
    if isinstance(elastic, dict):
        pairs.append(("Elastic", elastic_text(elastic)))
    if status.recent:
        last = status.recent[-1]
        pairs.append(("Moved", f"why: {last.why}, {last.worker} {last.from_pool or NONE} "
                                   f"-> {last.to_pool} at {iso_time(last.time)}"))  # fmt: skip
    if status.conflict:
        pairs.append(("Conflict", status.conflict))
    return pairs


def elastic_text(elastic: dict[str, Any]) -> str:
    """``target_in_flight pool=a:2,pool=b:4; scale down after 60 s; tolerance 0.1``."""
    targets = elastic.get("target_in_flight")
    shown = pools_text(targets) if isinstance(targets, dict) else str(targets)
    return (
        f"target_in_flight {shown}; scale down after {number(elastic.get('scale_down_after', 0))}"
        f" s; tolerance {number(elastic.get('tolerance', 0))}"
    )


def count_headers(status: PoolStatusInfo) -> tuple[str, ...]:
    return ELASTIC_HEADERS if _elastic(status) else COUNT_HEADERS


def count_rows(status: PoolStatusInfo) -> list[list[str]]:
    if not _elastic(status):
        return [[c.pool, number(c.weight), str(c.wanted), str(c.actual)] for c in status.pools]
    return [
        [c.pool, number(c.weight), number(c.demand or 0.0), str(c.want), str(c.wanted),
         str(c.actual)]
        for c in status.pools
    ]  # fmt: skip


def _elastic(status: PoolStatusInfo) -> bool:
    return any(c.want is not None for c in status.pools)


def status_object(status: PoolStatusInfo) -> dict[str, Any]:
    return {
        "name": status.policy.name,
        "policy": policy_object(status.policy),
        "replica": status.replica,
        "leader": status.leader or None,
        "epoch": status.epoch,
        "leading": status.leading,
        "workers": status.workers,
        "balanced": status.balanced,
        "pools": [
            {
                "pool": c.pool,
                "weight": c.weight,
                "demand": c.demand,
                "want": c.want,
                "target": c.wanted,
                "actual": c.actual,
            }
            for c in status.pools
        ],
        "by_domain": {domain: dict(pools) for domain, pools in status.by_domain.items()},
        "pending": [move_object(m) for m in status.pending],
        "excluded": list(status.excluded),
        "recent": [move_object(m) for m in status.recent],
        "drift": [drift_object(d) for d in status.drift],
        "budget_left": status.budget_left,
        "conflict": status.conflict or None,
        "failing": [failure_object(f) for f in status.failing],
    }


def pool_event_object(info: PoolEventInfo) -> dict[str, Any]:
    return {
        "kind": info.kind,
        "policy": info.policy or None,
        "worker": info.worker or None,
        "from": info.from_pool or None,
        "to": info.to_pool or None,
        "why": info.why or None,
        "epoch": info.epoch or None,
        "leader": info.leader or None,
        "held": list(info.held),
        "message": info.message,
    }


def pool_event_row(event: EventInfo, wide: bool, id_prefix: int = SHORT_ID) -> list[str]:
    """An ``events tail`` row of a pool event: EVENT ``POOL``, CHANGE its kind and what
    happened."""
    info = event.pool
    assert info is not None
    worker = info.worker if wide else info.worker[:id_prefix]
    start = [iso_time(event.time), str(event.revision), "POOL", worker or "-"]
    model = ["-"] if wide else []
    return [*start, *model, f"{info.kind} {info.message}"]
