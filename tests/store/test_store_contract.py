"""One suite, every backend: the contract in ``dynamod/store/base.py``.

Each test runs against memory, file, etcd and NATS (real servers on loopback).
"""

from __future__ import annotations

import asyncio
import time

import pytest

import dynamod.store.base as store_base
from dynamod.errors import (
    InvalidKeyError,
    KeyNotFoundError,
    LeaseExpiredError,
    RevisionMismatchError,
    StoreClosedError,
)
from dynamod.store import KEEP, Delete, Put, Resync, Store, WatchEvent, keep_alive
from tests.support.streams import fold, next_event

pytestmark = pytest.mark.timeout(60)


async def test_get_of_a_missing_key_is_none(store: Store) -> None:
    assert await store.get("nothing/here") is None


async def test_put_then_get_returns_value_and_revision(store: Store) -> None:
    revision = await store.put("a/b", b"one")
    entry = await store.get("a/b")
    assert entry is not None
    assert (entry.key, entry.value, entry.revision) == ("a/b", b"one", revision)


async def test_revisions_increase_across_keys(store: Store) -> None:
    first = await store.put("r/one", b"1")
    second = await store.put("r/two", b"2")
    third = await store.put("r/one", b"3")
    assert first < second < third


async def test_ten_concurrent_creates_have_exactly_one_winner(store: Store) -> None:
    results = await asyncio.gather(
        *(store.put("race/key", f"{i}".encode(), expect=0) for i in range(10)),
        return_exceptions=True,
    )
    winners = [r for r in results if isinstance(r, int)]
    losers = [r for r in results if isinstance(r, RevisionMismatchError)]
    assert len(winners) == 1
    assert len(losers) == 9
    assert all(loser.actual == winners[0] for loser in losers)
    entry = await store.get("race/key")
    assert entry is not None and entry.revision == winners[0]


async def test_create_only_refuses_an_existing_key(store: Store) -> None:
    revision = await store.put("k", b"v")
    with pytest.raises(RevisionMismatchError) as caught:
        await store.put("k", b"w", expect=0)
    assert caught.value.actual == revision
    entry = await store.get("k")
    assert entry is not None and entry.value == b"v"


async def test_cas_at_the_read_revision_succeeds(store: Store) -> None:
    revision = await store.put("cas/key", b"1")
    new = await store.put("cas/key", b"2", expect=revision)
    assert new > revision
    entry = await store.get("cas/key")
    assert entry is not None and (entry.value, entry.revision) == (b"2", new)


async def test_cas_at_a_stale_revision_fails_with_the_actual_revision(store: Store) -> None:
    stale = await store.put("cas/key", b"1")
    current = await store.put("cas/key", b"2")
    with pytest.raises(RevisionMismatchError) as caught:
        await store.put("cas/key", b"3", expect=stale)
    assert (caught.value.expected, caught.value.actual) == (stale, current)
    entry = await store.get("cas/key")
    assert entry is not None and entry.value == b"2"


async def test_cas_on_a_missing_key_fails_and_creates_nothing(store: Store) -> None:
    with pytest.raises(KeyNotFoundError):
        await store.put("cas/missing", b"x", expect=7)
    assert await store.get("cas/missing") is None
    assert (await store.list("cas"))[0] == []


async def test_delete_removes_and_missing_delete_is_quiet(store: Store) -> None:
    await store.put("d/key", b"v")
    await store.delete("d/key")
    assert await store.get("d/key") is None
    await store.delete("d/key")


async def test_delete_with_expect_follows_cas_rules(store: Store) -> None:
    stale = await store.put("d/key", b"1")
    current = await store.put("d/key", b"2")
    with pytest.raises(RevisionMismatchError) as caught:
        await store.delete("d/key", expect=stale)
    assert caught.value.actual == current
    await store.delete("d/key", expect=current)
    assert await store.get("d/key") is None
    with pytest.raises(KeyNotFoundError):
        await store.delete("d/key", expect=current)


async def test_list_respects_segment_boundaries_and_sorts(store: Store) -> None:
    for key in ["a/b/2", "a/b/1", "a/b", "a/bc", "a/bc/1", "b"]:
        await store.put(key, key.encode())
    entries, revision = await store.list("a/b")
    assert [e.key for e in entries] == ["a/b", "a/b/1", "a/b/2"]
    assert revision >= max(e.revision for e in entries)
    everything, _ = await store.list("")
    assert [e.key for e in everything] == ["a/b", "a/b/1", "a/b/2", "a/bc", "a/bc/1", "b"]


@pytest.mark.parametrize(
    "key", ["", "a b", "a//b", "/a", "a/", "../x", "a/./b", "é", "a\nb", "a*b", "x" * 1025]
)
async def test_illegal_keys_are_refused_before_any_io(store: Store, key: str) -> None:
    with pytest.raises(InvalidKeyError):
        await store.put(key, b"v")
    with pytest.raises(InvalidKeyError):
        await store.get(key)


async def test_legal_keys_that_backends_must_encode_come_back_unchanged(store: Store) -> None:
    keys = ["dots.in.name/x", "under_score/-dash-", "MiXeD/Case.9", "v1/workers/ns/c/e/ab12"]
    for key in keys:
        await store.put(key, key.encode())
    for key in keys:
        entry = await store.get(key)
        assert entry is not None and entry.key == key and entry.value == key.encode()
    listed, _ = await store.list("")
    assert sorted(e.key for e in listed) == sorted(keys)
    async with store.watch("dots.in.name") as watch:
        event = await next_event(watch)
        assert isinstance(event, Resync)
        assert [e.key for e in event.entries] == ["dots.in.name/x"]


async def test_first_watch_event_is_one_resync_even_when_empty(store: Store) -> None:
    async with store.watch("w") as watch:
        event = await next_event(watch)
        assert isinstance(event, Resync)
        assert event.entries == ()


async def test_first_watch_event_holds_the_current_state(store: Store) -> None:
    await store.put("w/1", b"a")
    await store.put("w/2", b"b")
    await store.put("w/2", b"c")
    async with store.watch("w") as watch:
        event = await next_event(watch)
        assert isinstance(event, Resync)
        assert {e.key: e.value for e in event.entries} == {"w/1": b"a", "w/2": b"c"}


async def test_write_right_after_watch_is_established_is_delivered(store: Store) -> None:
    async with store.watch("w") as watch:
        revision = await store.put("w/now", b"x")
        state: dict[str, bytes] = {}
        seen = 0
        while state.get("w/now") != b"x":
            event = await next_event(watch)
            fold(state, event)
            seen = max(seen, event.revision)
        assert seen >= revision


async def test_puts_and_deletes_arrive_in_store_order(store: Store) -> None:
    async with store.watch("o") as watch:
        assert isinstance(await next_event(watch), Resync)
        expected: list[tuple[str, str, int]] = []
        for i in range(20):
            expected.append(("put", f"o/{i % 3}", await store.put(f"o/{i % 3}", b"%d" % i)))
            if i % 5 == 4:
                await store.delete(f"o/{i % 3}")
                entries, revision = await store.list(f"o/{i % 3}")
                assert entries == []
                expected.append(("delete", f"o/{i % 3}", revision))
        got: list[tuple[str, str, int]] = []
        while len(got) < len(expected):
            event = await next_event(watch)
            assert not isinstance(event, Resync)
            got.append(("put" if isinstance(event, Put) else "delete", event.key, event.revision))
        assert [(op, key) for op, key, _ in got] == [(op, key) for op, key, _ in expected]
        revisions = [r for _, _, r in got]
        assert revisions == sorted(revisions)
        assert [r for op, _, r in got if op == "put"] == [r for op, _, r in expected if op == "put"]


async def test_watch_since_replays_what_came_after(store: Store) -> None:
    first = await store.put("s/1", b"a")
    second = await store.put("s/2", b"b")
    await store.delete("s/1")
    async with store.watch("s", since=first) as watch:
        event = await next_event(watch)
        if isinstance(event, Resync):
            pytest.fail(f"history after {first} is available; expected a replay, got {event}")
        assert isinstance(event, Put) and (event.key, event.revision) == ("s/2", second)
        event = await next_event(watch)
        assert isinstance(event, Delete) and event.key == "s/1"


async def test_watch_does_not_see_a_sibling_prefix(store: Store) -> None:
    async with store.watch("a/b") as watch:
        assert isinstance(await next_event(watch), Resync)
        await store.put("a/bc", b"no")
        await store.put("a/bc/d", b"no")
        await store.put("a/b/c", b"yes")
        event = await next_event(watch)
        assert isinstance(event, Put) and event.key == "a/b/c"


async def test_lease_expiry_delivers_a_delete(store: Store) -> None:
    lease = await store.grant(1)
    async with store.watch("l") as watch:
        assert isinstance(await next_event(watch), Resync)
        await store.put("l/owned", b"x", lease=lease)
        put = await next_event(watch)
        assert isinstance(put, Put)
        started = time.monotonic()
        gone = await next_event(watch, within=lease.ttl + 5)
        waited = time.monotonic() - started
        assert isinstance(gone, Delete) and gone.key == "l/owned"
        assert waited <= lease.ttl + 1.0, f"Delete came {waited:.2f} s after the last refresh"
    assert await store.get("l/owned") is None
    with pytest.raises(LeaseExpiredError):
        await store.refresh(lease)


async def test_revoke_deletes_at_once(store: Store) -> None:
    lease = await store.grant(30)
    await store.put("l/a", b"x", lease=lease)
    await store.put("l/b", b"y", lease=lease)
    async with store.watch("l") as watch:
        assert isinstance(await next_event(watch), Resync)
        await store.revoke(lease)
        events = [await next_event(watch, within=2) for _ in range(2)]
    assert all(isinstance(e, Delete) for e in events)
    assert {e.key for e in events if isinstance(e, Delete)} == {"l/a", "l/b"}
    with pytest.raises(LeaseExpiredError):
        await store.put("l/c", b"z", lease=lease)


async def test_keep_alive_holds_a_key_past_several_ttls(store: Store) -> None:
    lease = await store.grant(1)
    await store.put("l/kept", b"x", lease=lease)
    async with asyncio.TaskGroup() as group:
        refresher = group.create_task(keep_alive(store, lease))
        await asyncio.sleep(lease.ttl * 3.5)
        assert await store.get("l/kept") is not None
        refresher.cancel()
    await store.revoke(lease)
    assert await store.get("l/kept") is None


async def test_put_without_lease_unbinds_the_key(store: Store) -> None:
    lease = await store.grant(30)
    await store.put("l/key", b"x", lease=lease)
    await store.put("l/key", b"y")
    await store.revoke(lease)
    entry = await store.get("l/key")
    assert entry is not None and entry.value == b"y"


async def test_put_with_keep_stays_bound_to_the_lease(store: Store) -> None:
    lease = await store.grant(30)
    revision = await store.put("l/key", b"x", lease=lease)
    await store.put("l/key", b"y", expect=revision, lease=KEEP)
    await store.put("l/free", b"z")
    await store.put("l/free", b"w", lease=KEEP)
    await store.revoke(lease)
    assert await store.get("l/key") is None
    entry = await store.get("l/free")
    assert entry is not None and entry.value == b"w"


async def test_kept_lease_still_expires(store: Store) -> None:
    lease = await store.grant(1)
    revision = await store.put("l/key", b"x", lease=lease)
    await store.put("l/key", b"y", expect=revision, lease=KEEP)
    async with store.watch("l") as watch:
        event = await next_event(watch)
        assert isinstance(event, Resync)
        assert [e.value for e in event.entries] == [b"y"]
        gone = await next_event(watch, within=lease.ttl + 5)
        assert isinstance(gone, Delete)
        assert gone.key == "l/key"


async def test_slow_consumer_still_ends_at_the_final_state(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_base, "WATCH_QUEUE", 16)
    state: dict[str, bytes] = {}
    async with store.watch("slow") as watch:
        fold(state, await next_event(watch))
        for i in range(200):
            await store.put(f"slow/{i % 7}", b"%d" % i)
            if i % 11 == 10:
                await store.delete(f"slow/{i % 7}")
        final, revision = await store.list("slow")
        seen = 0
        while seen < revision:
            event = await next_event(watch)
            fold(state, event)
            seen = max(seen, event.revision)
    assert state == {e.key: e.value for e in final}


async def test_closing_the_store_ends_watches_cleanly(store: Store) -> None:
    events: list[WatchEvent] = []
    first = asyncio.Event()

    async def consume() -> None:
        async with store.watch("c") as watch:
            async for event in watch:
                events.append(event)
                first.set()

    async with asyncio.TaskGroup() as group:
        consumer = group.create_task(consume())
        await first.wait()
        await store.aclose()
    assert consumer.done() and consumer.exception() is None
    assert isinstance(events[0], Resync)


async def test_calls_after_close_raise_store_closed(store: Store) -> None:
    await store.aclose()
    with pytest.raises(StoreClosedError):
        await store.get("k")
    with pytest.raises(StoreClosedError):
        await store.put("k", b"v")
    await store.aclose()
