"""The pool reconciler's metrics, on the daemon's registry.

Every daemon, leader or not, plans each policy from its own view and publishes
``dynamod_pool_target_workers{policy,pool}`` (the plan's count), ``dynamod_pool_workers
{policy,pool}`` (routable workers holding exactly that pool) and
``dynamod_pool_pending_moves{policy}``; for an elastic policy also ``dynamod_pool_demand
{policy,pool}`` (requests in flight plus waiting, every daemon's) and
``dynamod_pool_wanted_workers{policy,pool}`` (the want that demand makes, settled by the
hysteresis window; the allotment is the target). The leader alone counts what it writes:
``dynamod_pool_moves_total{policy,why}``, ``dynamod_pool_move_failures_total{policy,
error}`` and ``dynamod_pool_drift_total{policy}`` (pool taints of owned workers changed by
another writer). ``dynamod_pool_leader`` is 1 while this daemon leads, with its epoch in
``dynamod_pool_leader_epoch``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from dynamod.pools.plan import Plan


class PoolMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.wanted = Gauge(
            "dynamod_pool_target_workers",
            "Routable workers each pool of a policy should have, by this daemon's plan.",
            ["policy", "pool"],
            registry=registry,
        )
        self.actual = Gauge(
            "dynamod_pool_workers",
            "Routable workers holding exactly that pool of the policy, in this daemon's view.",
            ["policy", "pool"],
            registry=registry,
        )
        self.pending = Gauge(
            "dynamod_pool_pending_moves",
            "Moves this daemon's plan still has for the policy.",
            ["policy"],
            registry=registry,
        )
        self.moves = Counter(
            "dynamod_pool_moves",
            "Workers the leader moved between pools, by policy and reason.",
            ["policy", "why"],
            registry=registry,
        )
        self.failures = Counter(
            "dynamod_pool_move_failures",
            "Moves the leader attempted that failed, by policy and error class.",
            ["policy", "error"],
            registry=registry,
        )
        self.drift = Counter(
            "dynamod_pool_drift",
            "Pool taints of owned workers changed by another writer, seen by the leader.",
            ["policy"],
            registry=registry,
        )
        self.demand = Gauge(
            "dynamod_pool_demand",
            "Requests in flight on an elastic pool's workers plus those waiting for one.",
            ["policy", "pool"],
            registry=registry,
        )
        self.want = Gauge(
            "dynamod_pool_wanted_workers",
            "Workers an elastic pool's demand wants (ceil(demand / target_in_flight), at "
            "least min_per_pool, settled by scale_down_after).",
            ["policy", "pool"],
            registry=registry,
        )
        self.leading = Gauge(
            "dynamod_pool_leader", "1 while this daemon leads the pools.", registry=registry
        )
        self.epoch = Gauge(
            "dynamod_pool_leader_epoch",
            "The fencing epoch of this daemon's term as leader (0 when it does not lead).",
            registry=registry,
        )
        self._pools: dict[str, tuple[str, ...]] = {}
        self._elastic: dict[str, tuple[str, ...]] = {}

    def planned(self, plan: Plan) -> None:
        """Publish the counts of ``plan``."""
        name = plan.policy
        old = self._pools.get(name, ())
        for pool in set(old) - set(plan.wanted):
            self.wanted.remove(name, pool)
            self.actual.remove(name, pool)
        for pool, count in plan.wanted.items():
            self.wanted.labels(name, pool).set(count)
            self.actual.labels(name, pool).set(plan.actual.get(pool, 0))
        self.pending.labels(name).set(len(plan.moves))
        self._pools[name] = tuple(plan.wanted)
        self._forget_elastic(name, set(plan.want))
        for pool, want in plan.want.items():
            self.demand.labels(name, pool).set(plan.demand.get(pool, 0.0))
            self.want.labels(name, pool).set(want)
        if plan.want:
            self._elastic[name] = tuple(plan.want)

    def _forget_elastic(self, name: str, keep: set[str]) -> None:
        for pool in set(self._elastic.pop(name, ())) - keep:
            self.demand.remove(name, pool)
            self.want.remove(name, pool)

    @property
    def policies(self) -> set[str]:
        """The policies whose gauges are published."""
        return set(self._pools)

    def forget(self, policy: str) -> None:
        """A removed policy's gauges go away (its counters stay: they only ever grow)."""
        pools = self._pools.pop(policy, None)
        self._forget_elastic(policy, set())
        if pools is None:
            return
        for pool in pools:
            self.wanted.remove(policy, pool)
            self.actual.remove(policy, pool)
        self.pending.remove(policy)

    def lead(self, epoch: int) -> None:
        self.leading.set(1 if epoch else 0)
        self.epoch.set(epoch)
