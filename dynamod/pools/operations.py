"""What the pool API does, without gRPC: apply, list, get, status, pause, resume, remove.
``api/pool_service.py`` only converts around these, as ``Control`` for the taints.

Writing a policy needs a write token, and a token limited to taint prefixes may only write
a policy whose pool taints (and the retired ones it strips) are under them, since the
leader will change those taints on every worker it owns. Every write, and every refused
one, is one audit line (``action`` ``pool-apply``, ``pool-pause``, ``pool-resume``,
``pool-remove``; the policy, its revision, the outcome). A dry run of an apply needs read
access only and is not audited. Reads (``ls``, ``get``) go to the store, so a policy
applied through another daemon is seen at once; ``status`` is this daemon's plan and the
leader's history as this daemon last saw it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from dynamod.audit import AuditLog
from dynamod.auth import Principal
from dynamod.discovery.view import WorkerView
from dynamod.errors import DynamoError, PolicyNotFoundError, PoolPolicyError
from dynamod.pool_results import (
    ApplyOutcome,
    DriftSeen,
    PolicyInfo,
    PoolCount,
    PoolMove,
    PoolStatusInfo,
    RemoveOutcome,
)
from dynamod.pools.plan import Plan
from dynamod.pools.policy import PoolPolicy, name_in, read_document, spread_refusal
from dynamod.pools.reconciler import PoolReconciler
from dynamod.pools.stored import (
    StoredPolicy,
    apply_policy,
    get_policy,
    list_policies,
    remove_policy,
    set_paused,
)
from dynamod.store import Store

T = TypeVar("T")

PARSERS: Final = 2
"""Policy documents parsed at once, each in a worker thread, never on the event loop."""


class PoolOperations:
    """See the module docstring."""

    def __init__(self, store: Store, workers: WorkerView, reconciler: PoolReconciler,
                 audit: AuditLog, replica: str) -> None:  # fmt: skip
        self.store = store
        self.workers = workers
        self.reconciler = reconciler
        self.audit = audit
        self.replica = replica
        self._parsing = asyncio.Semaphore(PARSERS)

    async def apply(
        self, document: str, *, caller: Principal, dry_run: bool = False
    ) -> ApplyOutcome:
        """Check and store a policy document (``stored.apply_policy``); the moves this
        daemon plans for it."""

        name = [""]  # the policy's name as soon as the document gives it

        async def write() -> ApplyOutcome:
            async with self._parsing:
                doc = await asyncio.to_thread(read_document, document)
            name[0] = name_in(doc)
            policy = PoolPolicy.from_dict(doc)
            self._check_spread(policy)
            if not dry_run:
                caller.require_write()
            caller.check_taints(policy.taints)
            stored, kind = await apply_policy(self.store, policy, dry_run=dry_run)
            caller.check_taints(stored.retired)
            moves = tuple(_pending(self.reconciler.plan_of(stored)))
            return ApplyOutcome(stored.info(), kind, moves, dry_run)

        if dry_run:
            return await write()
        outcome = await self._audited("pool-apply", lambda: name[0], caller, write)
        self._record(caller, "pool-apply", outcome.policy, outcome.outcome)
        return outcome

    def _check_spread(self, policy: PoolPolicy) -> None:
        """Refuse a spread whose plan would cost too much over the workers selected now."""
        if policy.spread_by is None:
            return
        domains = {
            record.runtime_config.topology_domains.get(policy.spread_by)
            for record in self.reconciler.owners.of(policy.match)
        }
        refused = spread_refusal(policy, len(domains))
        if refused:
            raise PoolPolicyError(refused)

    async def list(self) -> list[PolicyInfo]:
        return [stored.info() for stored in await list_policies(self.store)]

    async def get(self, name: str) -> PolicyInfo:
        return (await get_policy(self.store, name)).info()

    async def set_paused(
        self, name: str, paused: bool, *, caller: Principal
    ) -> tuple[PolicyInfo, bool]:
        """Pause (or resume) ``name``; the policy now, and whether this call changed it."""
        action = "pool-pause" if paused else "pool-resume"

        async def write() -> tuple[StoredPolicy, bool]:
            caller.require_write()
            old = await get_policy(self.store, name)
            caller.check_taints(old.policy.taints | old.retired)
            return await set_paused(self.store, name, paused)

        stored, changed = await self._audited(action, lambda: name, caller, write)
        self._record(caller, action, stored.info(), "ok" if changed else "unchanged")
        return stored.info(), changed

    async def remove(self, name: str, *, caller: Principal) -> RemoveOutcome:
        """Delete ``name``; its workers keep their taints (how many hold one is said)."""

        async def write() -> StoredPolicy:
            caller.require_write()
            old = await get_policy(self.store, name)
            caller.check_taints(old.policy.taints | old.retired)
            return await remove_policy(self.store, name)

        old = await self._audited("pool-remove", lambda: name, caller, write)
        self._record(caller, "pool-remove", old.info(), "ok")
        policy = old.policy
        holding = sum(
            1
            for record in self.workers.records()
            if policy.match.matches(record) and policy.taints.intersection(record.taints)
        )
        return RemoveOutcome(old.info(), holding)

    async def status(self, name: str) -> PoolStatusInfo:
        """The policy as this daemon plans it now, with the leader's history."""
        reconciler = self.reconciler
        stored = reconciler.view.policies.get(name) or await get_policy(self.store, name)
        plan = reconciler.plan_of(stored)
        leader = reconciler.view.leader
        history = reconciler.view.histories.get(name)
        counts = tuple(
            PoolCount(
                pool,
                float(weight),
                plan.wanted.get(pool, 0),
                plan.actual.get(pool, 0),
                plan.demand.get(pool) if plan.want else None,
                plan.want.get(pool),
            )
            for pool, weight in stored.policy.pools.items()
        )
        by_domain = {domain or "": dict(pools) for domain, pools in plan.wanted_by_domain.items()}
        recent: tuple[PoolMove, ...] = tuple(m for _, m in history.moves) if history else ()
        drift: tuple[DriftSeen, ...] = tuple(d for _, d in history.drift) if history else ()
        return PoolStatusInfo(
            policy=stored.info(),
            replica=self.replica,
            leader=leader.identity if leader else "",
            epoch=leader.epoch if leader else 0,
            leading=reconciler.leadership is not None,
            workers=sum(plan.wanted.values()) + len(plan.excluded),
            pools=counts,
            by_domain=by_domain,
            pending=tuple(_pending(plan)),
            excluded=plan.excluded,
            recent=recent,
            drift=drift,
            budget_left=reconciler.budget_left(name),
            conflict=reconciler.conflicts.get(name, "") or plan.refused,
            failing=reconciler.failing(name),
        )

    async def _audited(
        self,
        action: str,
        name: Callable[[], str],
        caller: Principal,
        write: Callable[[], Awaitable[T]],
    ) -> T:
        """Run ``write``; a refusal or failure is one audit line (naming the policy as far
        as ``name()`` can), then raised."""
        try:
            return await write()
        except DynamoError as exc:
            if not isinstance(exc, PolicyNotFoundError):
                self.audit.record(
                    caller=caller.name, action=action, pool_policy=name(),
                    outcome=type(exc).__name__, error=str(exc),
                )  # fmt: skip
            raise

    def _record(self, caller: Principal, action: str, policy: PolicyInfo, outcome: str) -> None:
        self.audit.record(
            caller=caller.name, action=action, pool_policy=policy.name,
            revision=policy.revision, document=dict(policy.document), outcome=outcome,
        )  # fmt: skip


def _pending(plan: Plan) -> list[PoolMove]:
    return [PoolMove(m.worker, m.from_pool or "", m.to_pool, m.why) for m in plan.moves]
