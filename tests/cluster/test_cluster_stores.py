"""A store on a 3-member cluster loses the member it uses while a writer writes, a watch
follows and a lease is kept alive: calls move to another member, the watch goes on to the
true state, no acknowledged write is lost and the lease stays alive.

The member killed is the worst one: the one in use that also leads (the etcd cluster, or
the bucket's JetStream stream), so the cluster elects a leader while the client moves. How
long that took is measured and recorded as figures, never asserted.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import pytest
from nats.aio.client import Client as NatsClient

from dynamod.store import Lease, Store, keep_alive, open_store
from tests.chaos.harness import Figures
from tests.support.servers import EtcdCluster, NatsCluster
from tests.support.storeload import Follower, Writer, answered

pytestmark = [pytest.mark.timeout(120)]

WRITES_AFTER = 30  # writes acknowledged after the fault before the checks


async def run_through_fault(
    store: Store, lease: Lease, fault: Callable[[], None], figures: Figures
) -> Follower:
    """Write, follow and keep ``lease`` alive; break a member with ``fault`` (run in a
    thread), write ``WRITES_AFTER`` more, then check."""
    await store.put("lease/k", b"alive", lease=lease)
    async with store.watch("w") as watch, asyncio.TaskGroup() as group:
        follower, writer = Follower(watch), Writer(store)
        following = group.create_task(follower.run())
        writing = group.create_task(writer.run())
        keeping = group.create_task(keep_alive(store, lease))
        await writer.until(lambda: writer.accepted >= 20)
        await asyncio.to_thread(fault)
        broken_at = time.monotonic()
        accepted = writer.accepted
        await writer.until(lambda: writer.accepted >= accepted + 1)
        figures.record("writes again after (s)", round(time.monotonic() - broken_at, 3))
        await writer.until(lambda: writer.accepted >= accepted + WRITES_AFTER)
        writing.cancel()
        # On NATS a list needs the JetStream meta leader, which may still be being elected.
        final, _ = await answered(lambda: store.list("w"))
        # The list's revision is the store's, and on NATS the lease's refresh (a re-publish
        # of ``lease/k``, outside the watch's prefix) may be the latest change: the watch
        # then never sees that revision. What it must reach is the last change under "w".
        last = max(entry.revision for entry in final)
        await follower.until(lambda: follower.seen >= last)
        figures.record("watch at the true state after (s)", round(time.monotonic() - broken_at, 3))
        figures.record("writes refused", writer.refused)
        keeping.cancel()
        following.cancel()
    state = {e.key: e.value for e in final}
    assert follower.state == state
    assert writer.lost(state) == []
    assert await answered(lambda: store.get("lease/k")) is not None, "the lease ended"
    await answered(lambda: store.refresh(lease))
    return follower


async def test_etcd_losing_the_member_in_use_and_leader(
    etcd3: EtcdCluster, figures: Figures
) -> None:
    leader = etcd3.leader()
    order = [leader, *(i for i in range(3) if i != leader)]
    async with await open_store(etcd3.url(f"c-{uuid.uuid4().hex[:8]}", order)) as store:
        lease = await store.grant(2)  # etcd's minimum: the move must beat it
        kill = lambda: etcd3.members[leader].stop(kill=True)  # noqa: E731
        follower = await run_through_fault(store, lease, kill, figures)
    assert follower.resyncs == 1, "the watch resumed from its revision on another member"


async def test_etcd_a_frozen_member_in_use_is_left_for_another(
    etcd3: EtcdCluster, figures: Figures
) -> None:
    """SIGSTOP: the member keeps its connections and answers nothing. A call waits half its
    deadline, moves on, and takes the watch along."""
    async with await open_store(etcd3.url(f"c-{uuid.uuid4().hex[:8]}")) as store:
        store.timeout = 2.0
        lease = await store.grant(2)
        await run_through_fault(store, lease, etcd3.members[0].freeze, figures)


async def stream_leader(cluster: NatsCluster, bucket: str) -> int:
    """The index of the node that leads the bucket's stream."""
    client = NatsClient()
    await client.connect(servers=[f"nats://127.0.0.1:{m.port}" for m in cluster.members])
    try:
        info = await client.jetstream().stream_info(f"KV_{bucket}")
    finally:
        await client.close()
    assert info.cluster is not None and info.cluster.leader is not None
    return cluster.index(info.cluster.leader)


async def test_nats_losing_the_server_in_use_and_stream_leader(
    nats3: NatsCluster, figures: Figures
) -> None:
    """An R3 bucket. JetStream elects a new stream leader 4-9 s after losing one (its raft
    election timeouts), and writes wait for it, so the lease here outlives that."""
    bucket = f"c{uuid.uuid4().hex[:8]}"
    async with await open_store(nats3.url(bucket) + "?replicas=3"):
        leader = await stream_leader(nats3, bucket)
    order = [leader, *(i for i in range(3) if i != leader)]
    async with await open_store(nats3.url(bucket, order)) as store:
        lease = await store.grant(15)
        kill = lambda: nats3.members[leader].stop(kill=True)  # noqa: E731
        await run_through_fault(store, lease, kill, figures)
