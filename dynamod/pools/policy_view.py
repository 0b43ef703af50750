"""The pool view: the stored policies, the leader's histories and who leads, kept current.

``PolicyView.run()`` watches four prefixes of the store — ``v1/pools`` (the policies),
``v1/pool-history`` (the leader's moves and drift), the leader key and ``v1/pool-demand``
(each daemon's share of the elastic pools' demand, ``demand.py``) — and every daemon runs
one, leader or not. Each change becomes a pool event (``events.PoolEvents``): a
policy APPLIED, CHANGED, PAUSED, RESUMED or REMOVED; each new history entry MOVED or
DRIFT; a new leader LEADER. The first snapshot of each prefix is the state the daemon
starts from and makes no events; a later snapshot (a reconnect, or ``run()`` again after
the reconciler restarted) is compared with what was known, so only real differences do,
and those made while nobody watched are published too. ``listen(callback)`` is told after
every change of the policies (the reconciler's cue to plan again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import replace

from dynamod.errors import PoolPolicyError
from dynamod.pool_results import DriftSeen, PoolEventInfo, PoolEventKind, PoolMove
from dynamod.pools.demand import DEMAND_PREFIX, DemandReport
from dynamod.pools.demand import decode as decode_demand
from dynamod.pools.history import HISTORY_PREFIX, PoolHistory
from dynamod.pools.history import decode as decode_history
from dynamod.pools.leader import LEADER_KEY, LeaderInfo, leader_of
from dynamod.pools.policy import POOLS_PREFIX
from dynamod.pools.pool_events import PoolEvents
from dynamod.pools.stored import StoredPolicy, decode, name_of
from dynamod.store import Entry, Put, Resync, Store, WatchEvent

log = logging.getLogger(__name__)

Apply = Callable[[WatchEvent, bool], None]


class PolicyView:
    """See the module docstring. ``policies`` by name, ``histories`` by policy name,
    ``leader`` (None while nobody leads), ``demand`` by daemon; ``ready`` once each prefix's
    first snapshot is applied."""

    def __init__(self, store: Store, events: PoolEvents) -> None:
        self.store = store
        self.events = events
        self.policies: dict[str, StoredPolicy] = {}
        self.histories: dict[str, PoolHistory] = {}
        self.leader: LeaderInfo | None = None
        self.demand: dict[str, DemandReport] = {}
        self.ready = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []
        self._unreadable: set[str] = set()
        """Daemons whose demand record could not be read (logged once until a good one)."""
        self._known: set[str] = set()
        """Prefixes whose first snapshot was applied: later ones are compared with it."""

    def listen(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` after every change of the policies; returns the way to stop."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    async def run(self) -> None:
        """Watch the four prefixes until cancelled (or the store closes)."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._follow(POOLS_PREFIX, self._on_policies), name="pool policies")
            group.create_task(
                self._follow(HISTORY_PREFIX, self._on_histories), name="pool histories"
            )
            group.create_task(self._follow(LEADER_KEY, self._on_leader), name="pool leader")
            group.create_task(self._follow(DEMAND_PREFIX, self._on_demand), name="pool demand")

    async def _follow(self, prefix: str, apply: Apply) -> None:
        async with self.store.watch(prefix) as watch:
            async for event in watch:
                apply(event, prefix not in self._known)
                if prefix not in self._known:
                    self._known.add(prefix)
                    if len(self._known) == 4:
                        self.ready.set()

    # Policies

    def _on_policies(self, event: WatchEvent, first: bool) -> None:
        if isinstance(event, Resync):
            now = {s.name: s for s in _readable(event.entries)}
            changed = [(name, now.get(name)) for name in set(self.policies) | set(now)]
        elif isinstance(event, Put):
            changed = [(name_of(event.key), _readable_one(event.entry))]
        else:
            changed = [(name_of(event.key), None)]
        for name, stored in sorted(changed, key=lambda c: c[0]):
            self._policy(name, stored, event.revision, quiet=first)
        for listener in list(self._listeners):
            listener()

    def _policy(self, name: str, stored: StoredPolicy | None, revision: int, quiet: bool) -> None:
        old = self.policies.get(name)
        if stored is None:
            self.policies.pop(name, None)
        else:
            self.policies[name] = stored
        kind = _policy_change(old, stored)
        if kind is None or quiet:
            return
        message = _policy_message(kind, name, stored or old)
        self.events.publish(PoolEventInfo(kind, name, message=message), revision)
        log.info("pool %s", message)

    # Histories

    def _on_histories(self, event: WatchEvent, first: bool) -> None:
        if isinstance(event, Resync):
            found = (decode_history(e) for e in event.entries)
            now = {j.policy: j for j in found if j is not None}
            for gone in set(self.histories) - set(now):
                del self.histories[gone]
            for history in now.values():
                self._history(history, quiet=first)
        elif isinstance(event, Put):
            read = decode_history(event.entry)
            if read is not None:
                self._history(read, quiet=first)
        else:
            self.histories.pop(event.key.removeprefix(f"{HISTORY_PREFIX}/"), None)

    def _history(self, history: PoolHistory, quiet: bool) -> None:
        old = self.histories.get(history.policy)
        self.histories[history.policy] = history
        seen = 0 if old is None or old.seq > history.seq else old.seq
        if quiet:
            return
        for _, entry in history.newer(seen):
            info, revision = _history_event(history.policy, entry)
            self.events.publish(info, revision)

    # Demand

    def _on_demand(self, event: WatchEvent, first: bool) -> None:
        if isinstance(event, Resync):
            self.demand = {}
            for entry in event.entries:
                self._demand(entry)
        elif isinstance(event, Put):
            self._demand(event.entry)
        else:
            self.demand.pop(event.key.removeprefix(f"{DEMAND_PREFIX}/"), None)

    def _demand(self, entry: Entry) -> None:
        daemon = entry.key.removeprefix(f"{DEMAND_PREFIX}/")
        try:
            self.demand[daemon] = decode_demand(entry)
        except ValueError as exc:
            if self.demand.pop(daemon, None) is not None or daemon not in self._unreadable:
                log.warning("pool demand of daemon %r is unreadable and ignored: %s", daemon, exc)
            self._unreadable.add(daemon)
        else:
            self._unreadable.discard(daemon)

    # The leader

    def _on_leader(self, event: WatchEvent, first: bool) -> None:
        if isinstance(event, Resync):
            entry = next((e for e in event.entries if e.key == LEADER_KEY), None)
            leader = None if entry is None else leader_of(entry)
        elif isinstance(event, Put):
            leader = leader_of(event.entry)
        else:
            leader = None
        old, self.leader = self.leader, leader
        if first or old == leader:
            return
        if leader is None:
            info = PoolEventInfo("LEADER", "", message="no daemon leads the pools now")
            self.events.publish(info, event.revision)
            return
        message = f"{leader.identity} leads the pools from epoch {leader.epoch}"
        info = PoolEventInfo(
            "LEADER", "", epoch=leader.epoch, leader=leader.identity, message=message
        )
        self.events.publish(info, leader.epoch)


def _readable(entries: Iterable[Entry]) -> Iterable[StoredPolicy]:
    for entry in entries:
        stored = _readable_one(entry)
        if stored is not None:
            yield stored


def _readable_one(entry: Entry) -> StoredPolicy | None:
    try:
        return decode(entry)
    except PoolPolicyError as exc:
        log.warning("%s; it is ignored until it is applied again", exc)
        return None


def _policy_change(old: StoredPolicy | None, new: StoredPolicy | None) -> PoolEventKind | None:
    if old is None:
        return None if new is None else "APPLIED"
    if new is None:
        return "REMOVED"
    if old.policy == new.policy:
        return None
    if replace(old.policy, paused=new.policy.paused) == new.policy:
        return "PAUSED" if new.policy.paused else "RESUMED"
    return "CHANGED"


def _policy_message(kind: PoolEventKind, name: str, stored: StoredPolicy | None) -> str:
    if kind in ("PAUSED", "RESUMED", "REMOVED") or stored is None:
        tail = {"PAUSED": "paused", "RESUMED": "resumed"}.get(
            kind, "removed; taints left as they are"
        )
        return f"policy {name} {tail}"
    policy = stored.policy
    pools = ", ".join(f"{t}:{w}" for t, w in policy.pools.items())
    verb = "applied" if kind == "APPLIED" else "changed"
    return f"policy {name} {verb}: selector {policy.selector}, pools {pools}"


def _history_event(policy: str, entry: PoolMove | DriftSeen) -> tuple[PoolEventInfo, int]:
    if isinstance(entry, PoolMove):
        came = entry.from_pool or "no pool"
        message = (
            f"{policy}: worker {entry.worker} {came} -> {entry.to_pool} ({entry.why}, "
            f"epoch {entry.epoch})"
        )
        info = PoolEventInfo(
            "MOVED", policy, entry.worker, entry.from_pool, entry.to_pool, entry.why,
            entry.epoch, entry.leader, message=message,
        )  # fmt: skip
        return info, entry.revision
    held = ",".join(entry.held) or "no pool"
    message = (
        f"{policy}: worker {entry.worker} holds {held}, assigned {entry.assigned}, changed by "
        f"another writer; {entry.action}"
    )
    info = PoolEventInfo(
        "DRIFT", policy, entry.worker, to_pool=entry.assigned, why=entry.action,
        held=entry.held, message=message,
    )  # fmt: skip
    return info, entry.revision
