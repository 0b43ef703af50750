"""Intents settled into the log: the moves the store shows made become history entries and
audit lines marked ``reconciled``; the others are dropped, one warning per batch.

Two callers (``intents.py`` has the why): a leader at the start of its term, for the
intents another term left in a policy's history, and a leader before a round's writes, for
its own intents whose batch never returned (a round that failed while they were in
flight: their outcome is unknown to it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from dynamod.audit import AuditLog, at
from dynamod.discovery.view import WorkerView
from dynamod.pool_results import PoolMove
from dynamod.pools.history import HistoryWriter
from dynamod.pools.intents import Intended, Intent, Settled, settle

log = logging.getLogger(__name__)

DROPPED_NAMED: Final = 8
"""Workers a warning about an intent's dropped moves names (then a count)."""


@dataclass(frozen=True)
class Settling:
    """Who settles, for which policy, and where the made moves are audited (None: the log
    only)."""

    workers: WorkerView
    policy: str
    identity: str
    epoch: int
    audit: AuditLog | None


def settle_into(history: HistoryWriter, intents: Iterable[Intent], how: Settling) -> None:
    """Settle ``intents`` (``intents.settle``) into ``history`` and the audit log; the
    entries are written at the next flush. Moves already in ``history`` are left out."""
    intents = list(intents)
    if not intents:
        return
    logged = [m for _, m in history.base.moves]
    logged += [e for e in history.unwritten if isinstance(e, PoolMove)]
    made, dropped = settle(intents, how.workers, logged)
    for settled in made:
        history.add(settled.entry(how.identity))
        _audit(how, settled)
    for intent, moves in _by_intent(dropped):
        workers = ", ".join(m.worker for m in moves[:DROPPED_NAMED])
        more = f" and {len(moves) - DROPPED_NAMED} more" if len(moves) > DROPPED_NAMED else ""
        log.warning(
            "pool policy %s: %d moves that %s intended (epoch %d) are not in the store, not "
            "made or not sent: dropped from the history (workers %s%s)", how.policy,
            len(moves), intent.leader, intent.epoch, workers, more,
        )  # fmt: skip
    log.info(
        "pool policy %s: %d moves sent and not logged are now in the history (reconciled), "
        "%d not made are dropped", how.policy, len(made), len(dropped),
    )  # fmt: skip


def _audit(how: Settling, settled: Settled) -> None:
    if how.audit is None:
        return
    intent, move, record = settled.intent, settled.move, settled.record
    how.audit.record(
        source="dynamod", caller=f"pools@{how.identity}", peer="", action="replace",
        worker=move.worker, key=move.key, after=list(record.taints),
        revision=settled.revision, outcome="ok", pool_policy=how.policy,
        epoch=intent.epoch, leader=intent.leader,
        move={"from": move.from_pool or None, "to": move.to_pool, "why": move.why},
        sent=at(intent.sent), reconciled={"by": how.identity, "epoch": how.epoch},
    )  # fmt: skip


def _by_intent(pairs: list[tuple[Intent, Intended]]) -> list[tuple[Intent, list[Intended]]]:
    grouped: dict[int, tuple[Intent, list[Intended]]] = {}
    for intent, move in pairs:
        grouped.setdefault(id(intent), (intent, []))[1].append(move)
    return list(grouped.values())
