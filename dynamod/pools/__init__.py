"""Pool policies: desired shares of pool taints over workers, and the one writer that
keeps them true.

The pure parts (no store, no I/O, no clock): ``policy`` parses and checks a policy
document; ``apportion`` turns weights into counts (per topology domain too); ``plan``
turns a policy and the workers it owns into the fewest moves; ``move_budget`` spends a
policy's move budget. On the store: ``leader`` (one writer across every dynamod on a
store: election, lease, fencing epoch); ``stored`` (policies at ``v1/pools/<name>``:
apply, pause, remove); ``history`` (the leader's recent moves and drift, for every
daemon); ``policy_view`` (the live policies, histories and leader) and ``pool_events``
(pool events for ``events tail``); ``reconciler`` (plans on every daemon, writes as the
leader) with ``reconcile_step`` (one policy's step as the leader) and ``move_failures``
(each worker's back-off); ``operations`` (what the API does); ``pool_metrics``. Import
each from its module (``from dynamod.pools.plan import plan``): the package re-exports
nothing, since ``plan`` and ``apportion`` name both a module and its main function, and so
that the pure parts load without the store.
"""
