"""Pool policies: desired shares of pool taints over workers, and the plan that reaches them.

``policy`` parses and checks a policy document; ``plan`` turns a policy and the workers it
owns into counts and the fewest moves; ``budget`` spends a policy's move budget. These
three are pure (no store, no I/O) and are what this package exports. ``leader`` (one
writer across every dynamod on a store: election, lease, fencing epoch) talks to the store
and is imported from its module, so that the pure parts load without the store.
"""
