"""``Store.swap_all``: many keys, each at its expected revision, all or none in one
revision, each key's lease kept (etcd: one transaction; memory: the reference); stores
without multi-key transactions (file, NATS) refuse it, so their writers go one key at a
time."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamod.errors import (
    InvalidInputError,
    KeyNotFoundError,
    RevisionMismatchError,
    UnsupportedError,
)
from dynamod.store import Swap, open_store
from dynamod.store.etcd.store import MAX_SWAPS
from tests.conftest import backend_url


@pytest.mark.parametrize("backend", ["memory", "etcd"])
async def test_all_or_none_in_one_revision_keeping_each_lease(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    async with await open_store(backend_url(backend, request, tmp_path)) as store:
        assert store.max_swaps == MAX_SWAPS
        lease = await store.grant(60)
        revisions = [await store.put(f"k/{n}", b"old", lease=lease) for n in range(3)]
        swaps = [Swap(f"k/{n}", b"new", r) for n, r in enumerate(revisions)]
        stale = [*swaps[:2], Swap("k/2", b"new", revisions[2] - 1)]
        with pytest.raises(RevisionMismatchError) as caught:
            await store.swap_all(stale)
        assert "k/2" in str(caught.value)
        assert [(await store.get(f"k/{n}")).value for n in range(3)] == [b"old"] * 3  # type: ignore[union-attr]
        revision = await store.swap_all(swaps)
        entries = [await store.get(f"k/{n}") for n in range(3)]
        assert [(e.value, e.revision) for e in entries if e] == [(b"new", revision)] * 3
        await store.revoke(lease)  # the lease was kept: the keys go with it
        assert [await store.get(f"k/{n}") for n in range(3)] == [None] * 3
        with pytest.raises(KeyNotFoundError):
            await store.swap_all([Swap("k/0", b"x", revision)])
        with pytest.raises(InvalidInputError, match=f"1 to {MAX_SWAPS} keys"):
            await store.swap_all([Swap(f"k/{n}", b"x", 1) for n in range(MAX_SWAPS + 1)])


async def test_a_store_of_one_key_at_a_time_refuses(tmp_path: Path) -> None:
    async with await open_store((tmp_path / "store").as_uri()) as store:
        assert store.max_swaps == 0
        with pytest.raises(UnsupportedError, match="one key at a time"):
            await store.swap_all([Swap("k", b"x", 1)])
