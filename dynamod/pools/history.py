"""The leader's history of a policy: its recent moves and the drift it saw, in the store.

Only the leader knows which writes are its moves (and their epochs) and which changes were
drift; it writes that down at ``v1/pool-history/<policy>`` so that every daemon can show it
(``pools status`` answers on any daemon, ``events tail`` shows moves and drift on any
daemon) and so that it outlives a failover. The value is JSON: ``leader``, ``epoch``,
``seq`` (entries ever appended), and the last ``KEEP`` moves and ``KEEP`` drift entries,
each with its ``seq``. A reader that saw ``seq`` N before reports every entry above N as
new. An elastic policy's history also keeps its hysteresis window (``elastic.Window``), so
a new leader carries on the wants of the last one instead of shrinking pools at once: it
is written when its wants change, else at most every ``WINDOW_EVERY`` seconds, so the
window a new leader starts from is at most that old. The workers whose moves are failing
(``MoveFailure``: the last error, the attempts, the next one) are kept too, at most
``KEEP``, written at the next flush after they change, so ``pools status`` on a follower
shows why a move is pending, as the leader's does. A batch of moves being written is kept
as its ``Intent`` (``intents.py``): written before the batch is sent, replaced by the batch's
moves at the next write, and settled by the next leader at its start when its leader died
in between.

Writes are the leader's alone: ``HistoryWriter.flush`` calls the term's ``fence()`` right
before a compare-and-swap at the revision it last read or wrote, so a deposed leader's
late write fails at the store once the next leader has written (and is refused by the fence
before that). A history is written after each round that moved a worker or saw drift, before
each batch of moves (its intent, with the entries so far), and every ``FLUSH_EVERY`` entries
within a long round.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Final

from dynamod.errors import KeyNotFoundError, RevisionMismatchError
from dynamod.pool_results import DriftSeen, MoveFailure, PoolMove
from dynamod.pools.elastic import Window
from dynamod.pools.intents import Intent, intent_json, intent_of
from dynamod.store import Entry, Store

log = logging.getLogger(__name__)

HISTORY_PREFIX: Final = "v1/pool-history"
KEEP: Final = 100
"""Moves, and drift entries, a history keeps (the newest)."""
FLUSH_EVERY: Final = 100
"""A round that makes more moves than this writes its history every this many entries, so
that no entry is dropped unseen by the readers."""
WINDOW_EVERY: Final = 5.0
"""Seconds between two writes of an elastic policy's window whose wants did not change."""
NO_WINDOW: Final = Window()


@dataclass(frozen=True)
class PoolHistory:
    """A policy's history as read: entries are ``(seq, move)`` and ``(seq, drift)``, oldest
    first."""

    policy: str
    leader: str = ""
    epoch: int = 0
    seq: int = 0
    moves: tuple[tuple[int, PoolMove], ...] = ()
    drift: tuple[tuple[int, DriftSeen], ...] = ()
    window: Window = NO_WINDOW
    """An elastic policy's hysteresis window as the leader last wrote it."""
    failing: tuple[MoveFailure, ...] = ()
    """The workers whose moves were failing when the leader last wrote."""
    intents: tuple[Intent, ...] = ()
    """The batches of moves sent whose moves are not written here yet (``intents.py``)."""
    revision: int = 0

    def newer(self, seen: int) -> list[tuple[int, PoolMove | DriftSeen]]:
        """The entries after sequence ``seen``, in order."""
        entries: list[tuple[int, PoolMove | DriftSeen]] = [*self.moves, *self.drift]
        return sorted((e for e in entries if e[0] > seen), key=lambda e: e[0])


def history_key(policy: str) -> str:
    return f"{HISTORY_PREFIX}/{policy}"


def encode(history: PoolHistory) -> bytes:
    body: dict[str, Any] = {
        "policy": history.policy,
        "leader": history.leader,
        "epoch": history.epoch,
        "seq": history.seq,
        "moves": [{"seq": seq, **_move_json(move)} for seq, move in history.moves],
        "drift": [{"seq": seq, **_drift_json(drift)} for seq, drift in history.drift],
    }
    if history.window != NO_WINDOW:
        body["window"] = history.window.to_json()
    if history.failing:
        body["failing"] = [_failure_json(f) for f in history.failing]
    if history.intents:
        body["intents"] = [intent_json(i) for i in history.intents]
    return json.dumps(body, separators=(",", ":")).encode()


def decode(entry: Entry) -> PoolHistory | None:
    """The history in ``entry``; None (logged) when it cannot be read."""
    try:
        body = json.loads(entry.value)
        return PoolHistory(
            policy=str(body["policy"]),
            leader=str(body["leader"]),
            epoch=int(body["epoch"]),
            seq=int(body["seq"]),
            moves=tuple((int(m["seq"]), _move(m)) for m in body["moves"]),
            drift=tuple((int(d["seq"]), _drift(d)) for d in body["drift"]),
            window=_window(entry.key, body.get("window")),
            failing=tuple(_failure(f) for f in body.get("failing", ())[:KEEP]),
            intents=tuple(intent_of(i, KEEP) for i in body.get("intents", ())[:KEEP]),
            revision=entry.revision,
        )
    except (ValueError, TypeError, KeyError) as exc:
        log.warning("pool history at %r is unreadable and ignored: %r", entry.key, exc)
        return None


def _window(key: str, obj: object) -> Window:
    """The stored window; an unreadable one is logged and the window starts empty (the
    moves and drift are still read)."""
    if obj is None:
        return NO_WINDOW
    try:
        return Window.from_json(obj)
    except (ValueError, TypeError) as exc:
        log.warning("the elastic window in %r is unreadable; it starts empty: %s", key, exc)
        return NO_WINDOW


class HistoryWriter:
    """The leader's side of one policy's history (see the module docstring): the history
    as last read or written (``base``, with its revision) and the entries appended since."""

    def __init__(self, policy: str, leader: str, epoch: int) -> None:
        self.policy = policy
        self.leader = leader
        self.epoch = epoch
        self.base = PoolHistory(policy, leader, epoch)
        self.unwritten: list[PoolMove | DriftSeen] = []
        self.window = NO_WINDOW
        """The elastic window to write (``keep``); the stored one is ``base.window``."""
        self.failing: tuple[MoveFailure, ...] = ()
        """The failing moves to write (``keep``); the stored ones are ``base.failing``."""
        self.pending: list[Intent] = []
        """This term's batches sent or about to be, whose moves are not appended yet."""
        self.inherited: tuple[Intent, ...] = ()
        """Another term's intents found in the store, carried until ``settled``."""
        self._window_written = 0.0
        self._lock = asyncio.Lock()

    @property
    def history(self) -> PoolHistory:
        """The history with every entry appended, written or not."""
        return self._with(self.unwritten)

    async def load(self, store: Store) -> None:
        """Continue the stored history (its history and sequence), if there is one."""
        entry = await store.get(history_key(self.policy))
        found = decode(entry) if entry is not None else None
        if found is not None:
            self.base = replace(found, leader=self.leader, epoch=self.epoch)
            mine = (self.leader, self.epoch)
            self.inherited = tuple(i for i in found.intents if (i.leader, i.epoch) != mine)
            if self.window == NO_WINDOW:  # a first load, not a lost race's
                self.window = found.window
        else:  # none (revision 0: a create), or unreadable: written over at its revision
            revision = 0 if entry is None else entry.revision
            self.base = PoolHistory(self.policy, self.leader, self.epoch, revision=revision)
            self.inherited = ()

    def add(self, entry: PoolMove | DriftSeen) -> None:
        self.unwritten.append(entry)

    def announce(self, intents: Iterable[Intent]) -> None:
        """Batches to be sent soon: the next ``flush`` writes their intents too, so the
        batches after the next one find theirs written (``intend``)."""
        self.pending.extend(intents)

    async def intend(self, store: Store, fence: Callable[[], int], intent: Intent) -> bool:
        """Once ``intent`` (a batch about to be sent) is written, True: at once when another
        flush wrote it (announced), else after a ``flush``. False when it could not be
        written (logged): the batch is not sent."""
        if not any(i is intent for i in self.pending):
            self.pending.append(intent)
        if not self._written(intent):
            await self.flush(store, fence)
        if self._written(intent):
            return True
        self.done(intent)
        return False

    def _written(self, intent: Intent) -> bool:
        return any(i is intent for i in self.base.intents)

    def done(self, intent: Intent) -> None:
        """``intent``'s batch has returned and its moves are appended: the next ``flush``
        writes them in its place."""
        self.pending = [i for i in self.pending if i is not intent]

    def take_pending(self) -> list[Intent]:
        """This term's intents still pending, forgotten here: a round ended while their
        batches were in flight (``reconciled.py`` settles them)."""
        pending, self.pending = self.pending, []
        return pending

    def settled(self) -> None:
        """The inherited intents are settled (``intents.settle``): not written again."""
        self.inherited = ()

    def _intents(self) -> tuple[Intent, ...]:
        return (*self.inherited, *self.pending)

    def keep_window(self, window: Window) -> None:
        """The elastic window the next ``flush`` writes, when it is due (module docstring)."""
        self.window = window

    def keep_failing(self, failing: tuple[MoveFailure, ...]) -> None:
        """The failing moves the next ``flush`` writes, when they changed."""
        self.failing = failing[:KEEP]

    def _due(self, now: float) -> bool:
        """Whether the window, the failing moves or the intents need a write without new
        entries."""
        if self.failing != self.base.failing or self._intents() != self.base.intents:
            return True
        stored = self.base.window
        if self.window == stored:
            return False
        return _wants(self.window) != _wants(stored) or now - self._window_written >= WINDOW_EVERY

    async def flush(self, store: Store, fence: Callable[[], int]) -> None:
        """Write the entries appended so far: ``fence()``, then a compare-and-swap at the
        revision last read or written; a lost race reads the stored history again and
        appends the entries to it (a few times, then they wait for the next flush)."""
        async with self._lock:
            for _ in range(3):
                count = len(self.unwritten)
                now = time.monotonic()
                if not count and not self._due(now):
                    return
                history = replace(
                    self._with(self.unwritten[:count]),
                    window=self.window,
                    failing=self.failing,
                    intents=self._intents(),
                )
                fence()
                try:
                    revision = await store.put(
                        history_key(self.policy), encode(history), expect=self.base.revision
                    )
                except (RevisionMismatchError, KeyNotFoundError):
                    await self.load(store)
                    continue
                self.base = replace(history, revision=revision)
                self._window_written = now
                del self.unwritten[:count]
                return
            log.warning("pool history of %r not written yet: it changed under us", self.policy)

    def _with(self, entries: Iterable[PoolMove | DriftSeen]) -> PoolHistory:
        base = self.base
        seq, moves, drift = base.seq, list(base.moves), list(base.drift)
        for entry in entries:
            seq += 1
            if isinstance(entry, PoolMove):
                moves.append((seq, entry))
            else:
                drift.append((seq, entry))
        return replace(base, seq=seq, moves=tuple(moves[-KEEP:]), drift=tuple(drift[-KEEP:]))


def _wants(window: Window) -> dict[str, list[int]]:
    """A window's wants without their times: what a write of it may not wait for."""
    return {pool: [want for _, want in entries] for pool, entries in window.wants.items()}


def _failure_json(failure: MoveFailure) -> dict[str, Any]:
    return {
        "worker": failure.worker, "to": failure.to_pool, "error": failure.error,
        "attempts": failure.attempts, "next_time": failure.next_time, "refused": failure.refused,
    }  # fmt: skip


def _failure(obj: dict[str, Any]) -> MoveFailure:
    return MoveFailure(
        str(obj["worker"]), str(obj["to"]), str(obj["error"]), int(obj["attempts"]),
        float(obj["next_time"]), bool(obj["refused"]),
    )  # fmt: skip


def _move_json(move: PoolMove) -> dict[str, Any]:
    return {
        "worker": move.worker, "from": move.from_pool, "to": move.to_pool, "why": move.why,
        "time": move.time, "epoch": move.epoch, "revision": move.revision,
        "leader": move.leader, **({"reconciled": move.reconciled} if move.reconciled else {}),
    }  # fmt: skip


def _move(obj: dict[str, Any]) -> PoolMove:
    return PoolMove(
        str(obj["worker"]), str(obj["from"]), str(obj["to"]), str(obj["why"]),
        float(obj["time"]), int(obj["epoch"]), int(obj["revision"]), str(obj["leader"]),
        str(obj.get("reconciled", "")),
    )  # fmt: skip


def _drift_json(drift: DriftSeen) -> dict[str, Any]:
    return {
        "worker": drift.worker, "held": list(drift.held), "assigned": drift.assigned,
        "revision": drift.revision, "time": drift.time, "action": drift.action,
    }  # fmt: skip


def _drift(obj: dict[str, Any]) -> DriftSeen:
    held: Iterable[object] = obj["held"]
    return DriftSeen(
        str(obj["worker"]), tuple(str(t) for t in held), str(obj["assigned"]),
        int(obj["revision"]), float(obj["time"]), str(obj["action"]),
    )  # fmt: skip
