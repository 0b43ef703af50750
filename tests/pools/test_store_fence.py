"""The fence on the store: a pool leader's write guarded by its leader key, in the same
transaction (``Store.swap_all(guard=...)``, ``Leadership.guard``), on the stores that
have transactions (etcd, real; memory, the reference semantics).

A deposed leader's write that reaches the store after its leader key changed hands (its
lease revoked and another contender elected, the key deleted, or rewritten) does not
apply, single or batched, all or none, and says the term ended; the successor's guarded
write applies. A write is "late" here by construction: it is sent after the deposition,
which is what the store sees of a request sent before a freeze and delivered after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dynamod.errors import InvalidInputError, NotLeaderError, UnsupportedError
from dynamod.pools.leader import LEADER_KEY, Leadership
from dynamod.store import Guard, Store, Swap, open_store
from tests.conftest import backend_url
from tests.pools.test_leader import HANDOVER, contenders, next_leader

pytestmark = pytest.mark.timeout(60)

A, B = "v1/workers/a", "v1/workers/b"


@pytest.fixture(params=["memory", "etcd"])
async def fenced(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A store with transactions: the leader's writes are fenced on it."""
    url = backend_url(request.param, request, tmp_path)
    async with await open_store(url) as store:
        yield store


async def _records(store: Store) -> dict[str, int]:
    return {key: await store.put(key, b"before") for key in (A, B)}


async def _values(store: Store) -> dict[str, bytes | None]:
    found = {key: await store.get(key) for key in (A, B)}
    return {key: None if e is None else e.value for key, e in found.items()}


async def _deposed_by_a_successor(store: Store) -> tuple[Leadership, Leadership]:
    """Two contenders: the first leader's lease is revoked from outside and the other one
    wins the next term; both terms, the first one lost."""
    async with contenders(store, 2) as elections:
        _, first = await next_leader(elections)
        await store.revoke(first.lease)
        async with asyncio.timeout(HANDOVER):
            await first.lost.wait()
        _, second = await next_leader(elections)
        assert second.epoch > first.epoch
        assert first.guard is not None and second.guard is not None
        return first, second


async def test_a_deposed_leaders_late_batch_applies_nothing_and_the_successors_does(
    fenced: Store,
) -> None:
    revisions = await _records(fenced)
    async with contenders(fenced, 2) as elections:
        _, first = await next_leader(elections)
        assert first.guard is not None and first.guard.key == LEADER_KEY
        await fenced.revoke(first.lease)
        async with asyncio.timeout(HANDOVER):
            await first.lost.wait()
        _, second = await next_leader(elections)
        assert second.guard is not None and second.epoch > first.epoch
        late = [Swap(key, b"late", revision) for key, revision in revisions.items()]
        with pytest.raises(NotLeaderError, match="term that made this write has ended"):
            await fenced.swap_all(late, guard=first.guard)
        assert await _values(fenced) == {A: b"before", B: b"before"}  # all or none: none

        single = [Swap(A, b"late", revisions[A])]
        with pytest.raises(NotLeaderError, match="nothing was written"):
            await fenced.swap_all(single, guard=first.guard)
        assert await _values(fenced) == {A: b"before", B: b"before"}

        current = [Swap(key, b"after", revision) for key, revision in revisions.items()]
        written = await fenced.swap_all(current, guard=second.guard)
        assert await _values(fenced) == {A: b"after", B: b"after"}
        entry = await fenced.get(A)
        assert entry is not None and entry.revision == written


async def test_a_deleted_or_rewritten_leader_key_fences_the_write(fenced: Store) -> None:
    revisions = await _records(fenced)
    swaps = [Swap(A, b"late", revisions[A])]
    async with contenders(fenced, 1) as [election]:
        term = await election.wait_leading()
        assert term.guard is not None
        held = await fenced.get(LEADER_KEY)
        assert held is not None
        await fenced.put(LEADER_KEY, held.value)  # the same value, rewritten by another
        with pytest.raises(NotLeaderError, match=f"is at revision {held.revision + 1}"):
            await fenced.swap_all(swaps, guard=term.guard)
        await fenced.delete(LEADER_KEY)
        with pytest.raises(NotLeaderError, match="is gone"):
            await fenced.swap_all(swaps, guard=term.guard)
    assert await _values(fenced) == {A: b"before", B: b"before"}


async def test_the_guard_is_checked_before_the_records_and_is_no_record(fenced: Store) -> None:
    """A stale record and a lost term: the term is what is named (the records do not
    matter once it ended). The guard's key cannot be one of the keys written."""
    revisions = await _records(fenced)
    await fenced.put(A, b"newer")
    first, _ = await _deposed_by_a_successor(fenced)
    assert first.guard is not None
    with pytest.raises(NotLeaderError):
        await fenced.swap_all([Swap(A, b"late", revisions[A])], guard=first.guard)
    with pytest.raises(InvalidInputError, match="not one of the keys written"):
        await fenced.swap_all([Swap(LEADER_KEY, b"x", 1)], guard=first.guard)
    with pytest.raises(InvalidInputError, match="revision > 0"):
        await fenced.swap_all([Swap(B, b"x", revisions[B])], guard=Guard(LEADER_KEY, 0))
    assert await _values(fenced) == {A: b"newer", B: b"before"}


async def test_a_store_without_transactions_fences_by_time_only(tmp_path: Path) -> None:
    """The file store writes one key at a time: a guarded write is refused, and the
    leader's moves go one by one, fenced by ``fence()`` (``leader.py``)."""
    async with await open_store((tmp_path / "store").as_uri()) as store:
        assert store.max_swaps == 0
        revision = await store.put(A, b"before")
        with pytest.raises(UnsupportedError):
            await store.swap_all([Swap(A, b"x", revision)], guard=Guard(LEADER_KEY, 1))
