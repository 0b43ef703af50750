"""Write-ahead intents: the moves a leader is about to write, in the history before the store.

A batch of moves (one ``swap_all``, or ``BATCH`` writes one by one where the store has no
transactions) is committed by the store before the leader writes its audit lines and its
history entries: a leader killed between the two leaves moves that no log holds. So before
a batch is sent, its ``Intent`` is in the policy's history (``history.PoolHistory.intents``,
the key every next leader reads): the leader writes the intents of the next ``BATCHES``
batches (those it keeps in flight) in one history write, which also carries the entries of
the batches already done, so the batches after the first find theirs written. The next
history write after a batch returns replaces its intent with the moves it made, in the
same value, so a stored history holds a batch either as its intent or as its moves.

An intent found in the history at a leader's start is a batch whose outcome no log holds:
``settle`` sorts its moves by what the store shows. A move the record shows made (a newer
revision than the plan saw, holding the new pool and not the old) becomes a history entry
and an audit line marked ``reconciled`` by the new leader, with the time its batch was
sent (when its intent was written: before the batch left, by at most ``BATCHES - 1``
batches' time) and the epoch and leader that made it; a move the record does not show
(the batch was refused, deposed, or never sent) is dropped, and said so in the log. A move
already in the history (its worker at that revision) is not written twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from dynamod.discovery.view import WorkerView
from dynamod.pool_results import PoolMove
from dynamod.records import WorkerRecord


class Intended(NamedTuple):
    """One move of an intent: the worker (id and record key), the pool it leaves ("" for
    none) and the one it gets, why, and the record's revision the plan saw."""

    worker: str
    key: str
    from_pool: str
    to_pool: str
    why: str
    expect: int


@dataclass(frozen=True)
class Intent:
    """A batch of moves about to be sent: when (unix seconds), by which leader and epoch."""

    sent: float
    epoch: int
    leader: str
    moves: tuple[Intended, ...]


class Settled(NamedTuple):
    """An intended move the store shows made: the record now and its revision."""

    intent: Intent
    move: Intended
    record: WorkerRecord
    revision: int

    def entry(self, reconciled_by: str) -> PoolMove:
        """The history entry of the move, as its leader would have written it, marked."""
        move = self.move
        return PoolMove(
            move.worker, move.from_pool, move.to_pool, move.why, self.intent.sent,
            self.intent.epoch, self.revision, self.intent.leader, reconciled_by,
        )  # fmt: skip


def settle(
    intents: Iterable[Intent], workers: WorkerView, logged: Iterable[PoolMove]
) -> tuple[list[Settled], list[tuple[Intent, Intended]]]:
    """The intended moves the store shows made and not yet in the history (``logged``), and
    those it does not show (dropped). A read."""
    known = {(m.worker, m.revision) for m in logged}
    made: list[Settled] = []
    dropped: list[tuple[Intent, Intended]] = []
    for intent in intents:
        for move in intent.moves:
            found = _made(move, workers)
            if found is None:
                dropped.append((intent, move))
            elif (move.worker, found[1]) not in known:
                made.append(Settled(intent, move, *found))
    return made, dropped


def _made(move: Intended, workers: WorkerView) -> tuple[WorkerRecord, int] | None:
    record = workers.get(move.key)
    revision = workers.revision_of(move.key)
    if record is None or revision <= move.expect or move.to_pool not in record.taints:
        return None
    if move.from_pool and move.from_pool != move.to_pool and move.from_pool in record.taints:
        return None
    return record, revision


def intent_json(intent: Intent) -> dict[str, Any]:
    """An intent as the history stores it: each move a list (an intent is written at every
    batch, so it is kept short)."""
    return {
        "sent": intent.sent, "epoch": intent.epoch, "leader": intent.leader,
        "moves": [list(move) for move in intent.moves],
    }  # fmt: skip


def intent_of(obj: dict[str, Any], most: int) -> Intent:
    """An intent as stored, with at most ``most`` moves (a batch has fewer)."""
    moves = tuple(
        Intended(str(w), str(k), str(f), str(t), str(y), int(e))
        for w, k, f, t, y, e in obj["moves"][:most]
    )
    return Intent(float(obj["sent"]), int(obj["epoch"]), str(obj["leader"]), moves)
