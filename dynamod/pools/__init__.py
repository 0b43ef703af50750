"""Pool policies: desired shares of pool taints over workers, and the plan that reaches them.

``policy`` parses and checks a policy document; ``apportion`` turns weights into counts
(per topology domain too); ``plan`` turns a policy and the workers it owns into the fewest
moves; ``budget`` spends a policy's move budget. Those four are pure (no store, no I/O, no
clock). ``leader`` (one writer across every dynamod on a store: election, lease, fencing
epoch) talks to the store. Import each from its module (``from dynamod.pools.plan import
plan``): the package re-exports nothing, since ``plan`` and ``apportion`` name both a
module and its main function, and so that the pure parts load without the store.
"""
