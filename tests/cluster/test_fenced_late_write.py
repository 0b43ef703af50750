"""The issue's scenario on a real 3-member etcd: a pool leader's write is sent to the
member it uses, which is frozen (SIGSTOP) before it reads the request; the leader's lease
expires on the other two, another contender wins the next term there; then the member is
thawed and reads the request. The write is guarded by the leader key in the same
transaction (``Store.swap_all(guard=...)``), so it does not apply: the record is as it
was, and the leader is told the term ended. An unguarded write sent beside it in the same
frozen window does apply after the thaw: the request really was delivered late.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from dynamod.errors import NotLeaderError
from dynamod.pools.leader import LeaderElection
from dynamod.store import Swap, open_store
from tests.support.servers import EtcdCluster

pytestmark = [pytest.mark.timeout(180)]

TTL = 2.0
LONG_CALL = 90.0
"""The frozen leader's call deadline: its requests wait for the thaw, not cancelled."""
WITHIN = 60.0


async def test_a_leader_frozen_mid_write_then_deposed_its_late_write_does_not_apply(
    etcd3: EtcdCluster,
) -> None:
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    frozen = next(i for i in range(3) if i != etcd3.leader())
    others = [i for i in range(3) if i != frozen]
    old = await open_store(etcd3.url(prefix, order=[frozen]), timeout=LONG_CALL)
    new = await open_store(etcd3.url(prefix, order=others))
    try:
        revisions = {key: await new.put(key, b"before") for key in ("v1/workers/a", "w/c")}
        async with LeaderElection(old, identity="old", ttl=TTL) as first:
            async with asyncio.timeout(WITHIN):
                term = await first.wait_leading()
            async with LeaderElection(new, identity="new", ttl=TTL) as second:
                guarded = [Swap("v1/workers/a", b"late", revisions["v1/workers/a"])]
                unguarded = [Swap("w/c", b"late", revisions["w/c"])]
                await asyncio.to_thread(etcd3.members[frozen].freeze)
                try:
                    late = asyncio.ensure_future(old.swap_all(guarded, guard=term.guard))
                    control = asyncio.ensure_future(old.swap_all(unguarded))
                    async with asyncio.timeout(WITHIN):
                        successor = await second.wait_leading()
                        await term.lost.wait()
                    assert successor.epoch > term.epoch
                    assert not late.done() and not control.done()  # still in flight
                finally:
                    etcd3.members[frozen].thaw()
                async with asyncio.timeout(WITHIN):
                    with pytest.raises(NotLeaderError, match="term that made this write"):
                        await late
                    await control
        a, c = await new.get("v1/workers/a"), await new.get("w/c")
        assert a is not None and a.value == b"before", "the deposed leader's late write landed"
        assert c is not None and c.value == b"late"
    finally:
        await old.aclose()
        await new.aclose()
