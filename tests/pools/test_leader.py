"""Leader election on every store backend: one leader among contenders, epochs that only
grow, a clean exit handing over at once, and a leader that loses its lease stopping before
anyone else starts (failover within the lease's TTL plus a second).

Waits are on events under deadlines. A deadline shorter than the TTL proves a handover did
not wait for an expiry; the one wall-clock bound asserted is the issue's (failover within
TTL + 1 s of the leader's last refresh).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
from collections.abc import AsyncIterator, Sequence

import pytest

from dynamod.errors import NotLeaderError, StoreClosedError
from dynamod.pools.leader import LEADER_KEY, LeaderElection, LeaderInfo, Leadership, read_leader
from dynamod.store import Store, open_store
from tests.pools.partition import Partition

pytestmark = pytest.mark.timeout(60)

LONG_TTL = 30.0  # any handover inside a deadline shorter than this did not wait for expiry
HANDOVER = 10.0


@contextlib.asynccontextmanager
async def contenders(
    store: Store, count: int, ttl: float = LONG_TTL
) -> AsyncIterator[list[LeaderElection]]:
    async with contextlib.AsyncExitStack() as stack:
        elections = [LeaderElection(store, identity=f"c{i}", ttl=ttl) for i in range(count)]
        for election in elections:
            await stack.enter_async_context(exits_in_time(election))
        yield elections


@contextlib.asynccontextmanager
async def exits_in_time(election: LeaderElection) -> AsyncIterator[None]:
    """``async with election``, whose exit must end its campaign within ``2 * HANDOVER``:
    one that outlives its cancellation fails with every task's stack (once, on a loaded
    machine, an exit waited past the test's timeout and said nothing more)."""
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(election)
        exiting = stack.pop_all()
        try:
            yield
        finally:
            closing = asyncio.ensure_future(exiting.aclose())
            done, _ = await asyncio.wait([closing], timeout=2 * HANDOVER)
            if not done:
                stacks = io.StringIO()
                for task in asyncio.all_tasks():
                    task.print_stack(file=stacks)
                closing.cancel()
                raise AssertionError(
                    f"{election.identity}'s campaign outlived its exit:\n{stacks.getvalue()}"
                )
            closing.result()


async def next_leader(
    elections: Sequence[LeaderElection], within: float = HANDOVER
) -> tuple[LeaderElection, Leadership]:
    """The first of ``elections`` to lead (or the one leading now), under a deadline."""
    waits = {asyncio.ensure_future(e.wait_leading()): e for e in elections}
    try:
        async with asyncio.timeout(within):
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
    first = done.pop()
    return waits[first], first.result()


async def test_one_of_three_contenders_leads_and_everyone_sees_who(store: Store) -> None:
    async with contenders(store, 3) as elections:
        winner, term = await next_leader(elections)
        assert [e for e in elections if e.leading is not None] == [winner]
        assert term.fence() == term.epoch
        for election in elections:
            assert await election.leader() == LeaderInfo(winner.identity, term.epoch)
        assert await read_leader(store) == LeaderInfo(winner.identity, term.epoch)
        assert await read_leader(store, "v1/leaders/other") is None
        for follower in (e for e in elections if e is not winner):
            assert follower.leading is None


async def test_epochs_strictly_increase_and_a_clean_exit_hands_over_at_once(
    store: Store,
) -> None:
    """Each leader leaves in turn; the next leads well inside the TTL (the exit revoked
    the lease), with a higher epoch, and the one that left is fenced."""
    elections = [LeaderElection(store, identity=f"c{i}", ttl=LONG_TTL) for i in range(3)]
    for election in elections:
        await election.__aenter__()
    remaining = list(elections)
    epochs: list[int] = []
    try:
        while remaining:
            leader, term = await next_leader(remaining)
            epochs.append(term.epoch)
            remaining.remove(leader)
            await leader.__aexit__(None, None, None)
            assert term.lost.is_set()
            with pytest.raises(NotLeaderError, match=r"no longer leads \(epoch"):
                term.fence()
    finally:
        for election in remaining:
            await election.__aexit__(None, None, None)
    assert epochs == sorted(epochs) and len(set(epochs)) == 3
    assert await read_leader(store) is None


async def test_a_leader_whose_lease_is_revoked_from_outside_is_deposed(store: Store) -> None:
    """Someone revokes the leader's lease: the leader sees it (its key's delete, or its next
    refresh), is fenced, and a new term begins with a higher epoch. No ordering between
    the two is claimed: a revoke from outside is not a lease the leader let lapse."""
    async with contenders(store, 2) as elections:
        _, term = await next_leader(elections)
        await store.revoke(term.lease)
        async with asyncio.timeout(HANDOVER):
            await term.lost.wait()
        with pytest.raises(NotLeaderError):
            term.fence()
        _, successor = await next_leader(elections)
        assert successor.epoch > term.epoch


async def test_a_partitioned_leader_stops_before_another_starts_failover_within_ttl(
    store: Store,
) -> None:
    """The leader's link to the store is cut: its refreshes never return, so its lease
    expires on the store. It must be deposed (``lost``, ``fence()`` raising) before any
    other contender leads, and another must lead within the lease's TTL + 1 s."""
    link = Partition(store)
    async with LeaderElection(link, identity="cut-off", ttl=2) as old:
        term = await asyncio.wait_for(old.wait_leading(), HANDOVER)
        async with contenders(store, 2, ttl=2) as followers:
            await asyncio.sleep(0)  # let them start campaigning
            link.cut()
            cut_at = time.monotonic()
            _, successor = await next_leader(followers, within=term.lease.ttl + 5)
            waited = time.monotonic() - cut_at
            assert term.lost.is_set(), "another leads while the old leader still acts"
            with pytest.raises(NotLeaderError, match="was not refreshed"):
                term.fence()
            assert successor.epoch > term.epoch
            assert waited <= term.lease.ttl + 1.0, f"failover took {waited:.2f} s"
            link.heal()


async def test_a_leader_paused_past_its_deadline_refuses_to_write_when_it_wakes() -> None:
    """A GC pause or SIGSTOP: the event loop runs nothing for longer than the term's
    margin. The first ``fence()`` after waking raises, before any timer could run."""
    async with await open_store("memory://") as store, LeaderElection(store, ttl=2) as election:
        term = await asyncio.wait_for(election.wait_leading(), HANDOVER)
        time.sleep(term.ttl * 0.5 + 0.1)  # noqa: ASYNC251 (blocking the loop is the point)
        assert not term.lost.is_set()  # no timer has had a chance to run
        with pytest.raises(NotLeaderError):
            term.fence()
        assert term.lost.is_set() and term.remaining() == 0.0


async def test_a_deposed_leader_campaigns_again_for_a_new_term(store: Store) -> None:
    async with LeaderElection(store, identity="only", ttl=LONG_TTL) as election:
        first = await asyncio.wait_for(election.wait_leading(), HANDOVER)
        await store.revoke(first.lease)
        async with asyncio.timeout(HANDOVER):
            await first.lost.wait()
        second = await asyncio.wait_for(election.wait_leading(), HANDOVER)
        assert second is not first and second.epoch > first.epoch
        assert await election.leader() == LeaderInfo("only", second.epoch)


async def test_a_leader_refreshes_and_keeps_leading_past_its_ttl() -> None:
    async with await open_store("memory://") as store, LeaderElection(store, ttl=1) as election:
        term = await asyncio.wait_for(election.wait_leading(), HANDOVER)
        await asyncio.sleep(2.5)  # several TTLs: refreshes, not luck, keep it
        assert term.fence() == term.epoch
        assert election.leading is term


async def test_cancelling_the_owner_propagates_and_hands_over(store: Store) -> None:
    started = asyncio.Event()

    async def lead() -> None:
        async with LeaderElection(store, identity="owner", ttl=LONG_TTL) as election:
            await election.wait_leading()
            started.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(lead())
    async with asyncio.timeout(HANDOVER):
        await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await read_leader(store) is None  # the exit revoked the lease


async def test_a_closed_store_ends_the_campaign_and_says_why() -> None:
    """Closing the store under an election is the caller's bug ("you closed it"): the
    waiters and the exit say so instead of hanging or campaigning forever."""
    store = await open_store("memory://")
    holder = LeaderElection(store, identity="holder", ttl=LONG_TTL)
    follower = LeaderElection(store, identity="follower", ttl=LONG_TTL)
    await holder.__aenter__()
    await follower.__aenter__()
    await asyncio.wait_for(holder.wait_leading(), HANDOVER)
    await store.aclose()
    with pytest.raises(StoreClosedError):
        await asyncio.wait_for(follower.wait_leading(), HANDOVER)
    with pytest.raises(StoreClosedError):
        await follower.__aexit__(None, None, None)
    with contextlib.suppress(StoreClosedError):  # raised if it noticed before being closed
        await holder.__aexit__(None, None, None)


def test_the_default_key_sits_beside_workers_and_pools() -> None:
    assert LEADER_KEY == "v1/leaders/pools"
    with pytest.raises(ValueError, match="positive number of seconds"):
        LeaderElection(None, ttl=0)  # type: ignore[arg-type]
