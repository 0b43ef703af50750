"""Each daemon's share of the elastic pools' demand, through a real store: published on a
lease, read by every pool view, added up; a daemon that stops publishing stops counting;
a record from another process that breaks the rules is ignored and logged once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping

import pytest

from dynamod.pools.demand import (
    MAX_REPORT_BYTES,
    Demand,
    DemandPublisher,
    DemandReport,
    decode,
    demand_key,
    encode,
)
from dynamod.pools.policy_view import PolicyView
from dynamod.pools.pool_events import PoolEvents
from dynamod.store import Entry, Store
from dynamod.store.base import validate_key
from tests.support.eventually import eventually

pytestmark = pytest.mark.timeout(60)

A = DemandReport("a", {"w1": 2, "w2": 1}, {("pool=premium",): 3})
B = DemandReport("b", {"w1": 1}, {("model=x", "pool=premium"): 1, ("pool=batch",): 4})


async def shown(view: PolicyView, daemons: set[str]) -> Mapping[str, DemandReport]:
    async def probe() -> Mapping[str, DemandReport]:
        return dict(view.demand)

    return await eventually(probe, lambda found: set(found) == daemons, what=f"{daemons}")


@contextlib.asynccontextmanager
async def running_view(store: Store) -> AsyncIterator[PolicyView]:
    view = PolicyView(store, PoolEvents())
    async with asyncio.TaskGroup() as group:
        task = group.create_task(view.run())
        try:
            await asyncio.wait_for(view.ready.wait(), 20)
            yield view
        finally:
            task.cancel()


async def test_every_daemon_s_share_is_published_and_added_up(shared_store: Store) -> None:
    wanted = {"a": True, "b": True}

    def publisher(report: DemandReport) -> DemandPublisher:
        return DemandPublisher(shared_store, lambda: report, lambda: wanted[report.daemon])

    publishers = [publisher(A), publisher(B)]
    async with running_view(shared_store) as view:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(p.run()) for p in publishers]
            found = await shown(view, {"a", "b"})
            assert found["b"] == B
            snapshot = Demand(lambda: A, lambda: view.demand).snapshot()
            assert snapshot.routed == {"w1": 3, "w2": 1}
            assert snapshot.waiting(["pool=premium", "pool=batch", "pool=none"]) == {
                "pool=premium": 4,
                "pool=batch": 4,
                "pool=none": 0,
            }
            wanted["b"] = False  # no elastic policy any more: b withdraws its record
            await shown(view, {"a"})
            for task in tasks:
                task.cancel()
        await shown(view, set())  # a cancelled publisher revokes its lease


def test_a_record_that_breaks_the_rules_is_refused_naming_what() -> None:
    def entry(value: bytes) -> Entry:
        return Entry(demand_key("x"), value, 1)

    assert decode(entry(encode(A))) == A
    for value, words in [
        (b"[]", "not a JSON object"),
        (b'{"in_flight": [], "waiting": []}', "in_flight must be an object"),
        (b'{"in_flight": {"w": -1}, "waiting": []}', "whole number >= 0, got -1"),
        (b'{"in_flight": {"w": true}, "waiting": []}', "got True"),
        (b'{"in_flight": {}, "waiting": [{"taints": [1], "count": 1}]}', "list of strings"),
        (b" " * (MAX_REPORT_BYTES + 1), f"at most {MAX_REPORT_BYTES}"),
    ]:
        with pytest.raises(ValueError, match=words):
            decode(entry(value))


async def test_an_unreadable_record_counts_nothing_and_is_logged_once(
    shared_store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "dynamod.pools.policy_view")
    async with running_view(shared_store) as view:
        await shared_store.put(demand_key("a"), encode(A))
        await shown(view, {"a"})
        for _ in range(3):
            await shared_store.put(demand_key("a"), b"not json")
        await shown(view, set())
        await shared_store.put(demand_key("b"), encode(B))
        await shown(view, {"b"})
        warned = [r for r in caplog.records if "pool demand of daemon 'a'" in r.getMessage()]
        assert len(warned) == 1
        await shared_store.put(demand_key("a"), encode(A))
        await shown(view, {"a", "b"})


def test_any_replica_id_has_a_key_of_its_own() -> None:
    """A replica id is any printable word; a key segment is not: odd ids get a safe key
    with a hash of the id, so two never share one, and the plain ones keep theirs."""
    assert demand_key("vm-1.a_b") == "v1/pool-demand/vm-1.a_b"
    odd = [demand_key(d) for d in ("h:1/é", "h:1/e", "..", "h_1_é")]
    assert len(set(odd)) == len(odd)
    for key in odd:
        assert validate_key(key) == key
