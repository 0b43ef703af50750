"""Registration, atomic taint updates and the discovery event stream, on every store."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import cast

import pytest

from dynamod.discovery.registration import Registration, register
from dynamod.discovery.updates import CAS_ATTEMPTS, update_taints
from dynamod.discovery.view import WorkerView
from dynamod.discovery_events import ViewResync, WorkerAdded, WorkerModified, WorkerRemoved
from dynamod.errors import (
    AmbiguousWorkerError,
    ConflictError,
    ImmutableFieldError,
    InvalidInputError,
    RevisionMismatchError,
    TaintError,
    WorkerNotFoundError,
)
from dynamod.records import ModelCard, WorkerRecord, mdcsum
from dynamod.store import KEEP, Entry, Store
from dynamod.store.base import LeaseArg
from dynamod.taints import TaintLimits, TaintUpdate
from tests.support.factories import make_record
from tests.support.streams import next_event

pytestmark = pytest.mark.timeout(120)


@contextlib.asynccontextmanager
async def running_view(store: Store) -> AsyncIterator[WorkerView]:
    worker_view = WorkerView(store)
    async with asyncio.TaskGroup() as group:
        task = group.create_task(worker_view.run())
        async with asyncio.timeout(10):
            await worker_view.ready.wait()
        yield worker_view
        task.cancel()


@pytest.fixture
async def view(store: Store) -> AsyncIterator[WorkerView]:
    async with running_view(store) as worker_view:
        yield worker_view


async def registered(store: Store, *, ttl: int = 30, **kwargs: object) -> WorkerRecord:
    record = make_record(**kwargs)  # type: ignore[arg-type]
    lease = await store.grant(ttl)
    stored, _ = await register(store, record, lease)
    return stored


async def stored_bytes(store: Store, key: str) -> bytes:
    entry = await store.get(key)
    assert entry is not None
    return entry.value


# --- update_taints ---


class RacingStore:
    """A real store that loses every compare-and-swap: another writer gets there first."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.cas_attempts = 0

    async def get(self, key: str) -> Entry | None:
        return await self.store.get(key)

    async def put(
        self, key: str, value: bytes, *, expect: int | None = None, lease: LeaseArg = None
    ) -> int:
        if expect is not None:
            self.cas_attempts += 1
            current = await self.store.get(key)
            assert current is not None
            await self.store.put(key, current.value, lease=KEEP)
        return await self.store.put(key, value, expect=expect, lease=lease)


async def test_eight_lost_races_raise_a_retryable_conflict(store: Store) -> None:
    worker = await registered(store, taints=["a"])
    racing = RacingStore(store)
    with pytest.raises(ConflictError) as caught:
        await update_taints(cast(Store, racing), worker.key, TaintUpdate.add(["b"]))
    assert racing.cas_attempts == CAS_ATTEMPTS == 8
    assert caught.value.retryable
    assert "8 attempts" in str(caught.value)
    record = WorkerRecord.from_bytes(await stored_bytes(store, worker.key))
    assert record.taints == ("a",)


class CountingStore(RacingStore):
    """A real store that counts the reads and writes an update makes, and loses no race."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.gets = 0

    async def get(self, key: str) -> Entry | None:
        self.gets += 1
        return await self.store.get(key)

    async def put(
        self, key: str, value: bytes, *, expect: int | None = None, lease: LeaseArg = None
    ) -> int:
        self.cas_attempts += expect is not None
        return await self.store.put(key, value, expect=expect, lease=lease)


async def test_an_update_at_the_revision_its_base_was_seen_is_one_round_trip(
    store: Store,
) -> None:
    """A worker's own route: its record as it follows it, and that record's revision."""
    record, revision = await register(store, make_record(taints=["a"]), await store.grant(60))
    counting = CountingStore(store)
    done = await update_taints(
        cast(Store, counting), record.key, TaintUpdate.add(["b"]),
        base=record, base_revision=revision,
    )  # fmt: skip
    assert (counting.gets, counting.cas_attempts) == (0, 1)
    assert done.after == ("a", "b") and done.revision > revision
    assert WorkerRecord.from_bytes(await stored_bytes(store, record.key)).taints == ("a", "b")


@pytest.mark.parametrize(
    ("meanwhile", "update", "limit", "expected"),
    [
        # the guess adds a taint while another writer added one: the CAS loses, a read wins
        (TaintUpdate.add(["y"]), TaintUpdate.add(["z"]), 8, ("x", "y", "z")),
        # the guess holds "x" already (nothing to do) but another writer removed it
        (TaintUpdate.remove(["x"]), TaintUpdate.add(["x"]), 8, ("x",)),
        # the guess would hold 3 taints, over the limit of 2, and refuses; the store holds 0
        (TaintUpdate.remove(["x"]), TaintUpdate.add(["w", "v"]), 2, ("v", "w")),
    ],
    ids=["lost-race", "unchanged-on-the-guess", "refused-on-the-guess"],
)
async def test_a_stale_guess_is_read_for_and_loses_nothing(
    store: Store,
    meanwhile: TaintUpdate,
    update: TaintUpdate,
    limit: int,
    expected: tuple[str, ...],
) -> None:
    record, revision = await register(store, make_record(taints=["x"]), await store.grant(60))
    await update_taints(store, record.key, meanwhile)
    counting = CountingStore(store)
    done = await update_taints(
        cast(Store, counting), record.key, update,
        base=record, base_revision=revision, limits=TaintLimits(count=limit),
    )  # fmt: skip
    assert done.after == expected and counting.gets >= 1
    assert WorkerRecord.from_bytes(await stored_bytes(store, record.key)).taints == expected


async def test_update_replace_add_remove_clear(store: Store) -> None:
    worker = await registered(store, taints=["a"], topology={"zone": "z1"})
    topo = "dynamo.topology/zone=z1"
    steps = [
        (TaintUpdate.replace(["b", "c"]), ("b", "c", topo)),
        (TaintUpdate.add(["d", "b"]), ("b", "c", "d", topo)),
        (TaintUpdate.remove(["c", "absent"]), ("b", "d", topo)),
        (TaintUpdate.clear(), (topo,)),
        (TaintUpdate.replace([]), (topo,)),
    ]
    for op, expected in steps:
        result = await update_taints(store, worker.key, op)
        assert result.after == expected
        stored = WorkerRecord.from_bytes(await stored_bytes(store, worker.key))
        assert stored.taints == expected
        assert mdcsum(stored.model_card) == mdcsum(worker.model_card)
        assert stored.runtime_config.topology_domains == {"zone": "z1"}


async def test_unchanged_update_writes_nothing(store: Store) -> None:
    worker = await registered(store, taints=["a", "b"])
    before = await store.get(worker.key)
    result = await update_taints(store, worker.key, TaintUpdate.replace(["b", "a", "a"]))
    assert not result.changed
    assert await store.get(worker.key) == before


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (
            lambda: TaintUpdate.add(["dynamo.topology/zone=b"]),
            TaintError,
            "taint 'dynamo.topology/zone=b' uses reserved prefix 'dynamo.topology/'",
        ),
        (
            lambda: TaintUpdate.remove(["dynamo.topology/zone=a"]),
            TaintError,
            "taint 'dynamo.topology/zone=a' uses reserved prefix 'dynamo.topology/'",
        ),
        (
            lambda: TaintUpdate.replace(["ok", "bad\ntaint"]),
            TaintError,
            "taint 'bad\\ntaint' has control or invisible character U+000A at position 3; "
            "taints may not hold control, format or line-separator characters",
        ),
        (lambda: TaintUpdate.replace([""]), TaintError, "taint '' is empty"),
        (lambda: TaintUpdate.add([]), InvalidInputError, "add needs at least one taint"),
        (lambda: TaintUpdate.remove([]), InvalidInputError, "remove needs at least one taint"),
        (
            lambda: TaintUpdate("clear", ("a",)),
            InvalidInputError,
            "clear takes no taints; use remove to drop some of them",
        ),
    ],
)
async def test_bad_input_is_refused_and_the_record_is_untouched(
    store: Store, build: object, error: type[Exception], message: str
) -> None:
    worker = await registered(store, taints=["a"], topology={"zone": "a"})
    before = await stored_bytes(store, worker.key)

    async def attempt() -> None:
        await update_taints(store, worker.key, build())  # type: ignore[operator]

    with pytest.raises(error) as caught:
        await attempt()
    assert str(caught.value) == message
    assert await stored_bytes(store, worker.key) == before


def test_duplicate_taints_in_one_op_collapse() -> None:
    assert TaintUpdate.add(["b", "a", "b"]).taints == ("a", "b")


async def test_expected_revision_is_an_optimistic_lock(store: Store) -> None:
    worker = await registered(store, taints=["a"])
    entry = await store.get(worker.key)
    assert entry is not None
    await update_taints(store, worker.key, TaintUpdate.add(["b"]))
    before = await stored_bytes(store, worker.key)
    with pytest.raises(RevisionMismatchError) as caught:
        await update_taints(
            store, worker.key, TaintUpdate.add(["c"]), expect_revision=entry.revision
        )
    assert caught.value.expected == entry.revision
    assert caught.value.actual > entry.revision
    assert await stored_bytes(store, worker.key) == before
    result = await update_taints(
        store, worker.key, TaintUpdate.add(["c"]), expect_revision=caught.value.actual
    )
    assert result.after == ("a", "b", "c")


async def test_unknown_worker_is_not_found(store: Store) -> None:
    with pytest.raises(WorkerNotFoundError, match="no worker is registered"):
        await update_taints(store, "v1/workers/n/c/e/feed", TaintUpdate.clear())


# --- registration ---


async def test_replayed_registration_keeps_the_latest_taints_and_emits_nothing(
    store: Store, view: WorkerView
) -> None:
    record = make_record(taints=["initial"])
    lease = await store.grant(30)
    await register(store, record, lease)
    await update_taints(store, record.key, TaintUpdate.replace(["updated"]))
    await view.wait_for(lambda v: (v.get(record.key) or record).taints == ("updated",))
    with view.subscribe(since=view.revision) as events:
        stored, _ = await register(store, record, await store.grant(30))
        assert stored.taints == ("updated",)
        marker = await registered(store, taints=["marker"])
        event = await next_event(events)
        assert isinstance(event, WorkerAdded)
        assert event.record.key == marker.key
    assert view.get(record.key) == stored


async def test_a_different_record_under_the_same_id_is_refused(store: Store) -> None:
    record = await registered(store, taints=["a"])
    impostor = make_record(instance_id=record.instance_id, model="mistral")
    with pytest.raises(ImmutableFieldError, match=r"'model_card\.name' is immutable"):
        await register(store, impostor, await store.grant(30))


async def test_identical_update_emits_nothing_and_two_updates_emit_two(
    store: Store, view: WorkerView
) -> None:
    worker = await registered(store, taints=["a"])
    await view.wait_for(lambda v: v.get(worker.key) is not None)
    with view.subscribe(since=view.revision) as events:
        await update_taints(store, worker.key, TaintUpdate.replace(["a"]))
        await update_taints(store, worker.key, TaintUpdate.add(["b"]))
        await update_taints(store, worker.key, TaintUpdate.replace(["c"]))
        first, second = await next_event(events), await next_event(events)
    assert isinstance(first, WorkerModified)
    assert (first.taints, first.added, first.removed) == (("a", "b"), ("b",), ())
    assert isinstance(second, WorkerModified)
    assert (second.taints, second.added, second.removed) == (("c",), ("c",), ("a", "b"))
    assert second.revision > first.revision


async def test_watcher_refuses_an_immutable_change_written_straight_to_the_store(
    store: Store, view: WorkerView
) -> None:
    worker = await registered(store, taints=["a"])
    await view.wait_for(lambda v: v.get(worker.key) is not None)
    forged = dataclasses.replace(worker, model_card=ModelCard(name="forged"))
    with view.subscribe(since=view.revision) as events:
        await store.put(worker.key, forged.to_bytes(), lease=KEEP)
        marker = await registered(store)
        event = await next_event(events)
        assert isinstance(event, WorkerAdded)
        assert event.record.key == marker.key
    assert view.get(worker.key) == worker
    assert view.refused == 1


async def test_registration_deregisters_on_exit_and_survives_a_deleted_key(
    store: Store, view: WorkerView
) -> None:
    record = make_record(taints=["a"])
    async with Registration(store, record, ttl=5) as registration:
        await view.wait_for(lambda v: v.get(record.key) is not None)
        await update_taints(store, record.key, TaintUpdate.add(["b"]))
        await view.wait_for(lambda v: (v.get(record.key) or record).taints == ("a", "b"))
        await store.delete(record.key)
        await view.wait_for(lambda v: v.get(record.key) is not None)
        assert (view.get(record.key) or record).taints == ("a", "b")
        assert registration.registered
    await view.wait_for(lambda v: v.get(record.key) is None, within=2)


async def test_view_finds_workers_by_unique_prefix(store: Store, view: WorkerView) -> None:
    a = await registered(store, instance_id="abc123")
    b = await registered(store, instance_id="abd456")
    await view.wait_for(lambda v: len(v) == 2)
    assert view.find("abc") == a
    assert view.find(b.key) == b
    with pytest.raises(AmbiguousWorkerError, match="'ab' is ambiguous: it matches 2 workers"):
        view.find("ab")
    with pytest.raises(WorkerNotFoundError, match="no worker with id 'zz'"):
        view.find("zz")


async def test_subscription_from_an_old_revision_replays_or_resyncs(
    store: Store, view: WorkerView
) -> None:
    first = await registered(store)
    await view.wait_for(lambda v: len(v) == 1)
    start = view.revision
    second = await registered(store)
    await view.wait_for(lambda v: len(v) == 2)
    with view.subscribe(since=start) as events:
        event = await next_event(events)
        assert isinstance(event, WorkerAdded)
        assert event.record.key == second.key
    with view.subscribe(since=-5) as events:
        event = await next_event(events)
        assert isinstance(event, ViewResync)
        assert {r.key for r in event.records} == {first.key, second.key}


async def test_a_slow_subscriber_gets_a_resync_and_never_blocks(
    store: Store, view: WorkerView
) -> None:
    worker = await registered(store)
    await view.wait_for(lambda v: len(v) == 1)
    with view.subscribe(since=view.revision, maxsize=2) as events:
        for i in range(6):
            await update_taints(store, worker.key, TaintUpdate.replace([f"t{i}"]))
        await view.wait_for(lambda v: (v.get(worker.key) or worker).taints == ("t5",))
        event = await next_event(events)
        assert isinstance(event, ViewResync)
        assert event.records[0].taints == ("t5",)
        assert events.resyncs >= 1


# --- across OS processes ---


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )


async def test_a_sigkilled_worker_leaves_the_view_within_its_ttl(
    shared_store: Store, shared_store_url: str
) -> None:
    proc = spawn("tests.discovery.worker_proc", shared_store_url, "5ca1ab1e", "2")
    try:
        async with running_view(shared_store) as view:
            await view.wait_for(
                lambda v: any(r.instance_id == "5ca1ab1e" for r in v.records()), within=30
            )
            lease_ttl = 2.0
            with view.subscribe(since=view.revision) as events:
                proc.send_signal(signal.SIGKILL)
                # A deadline, not a measure: the removal time is bench.report's to measure
                # (chaos: "removed after (s)"), on a machine that is not shared.
                event = await next_event(events, within=lease_ttl + 10)
            assert isinstance(event, WorkerRemoved)
            assert event.record.instance_id == "5ca1ab1e"
    finally:
        proc.kill()
        proc.communicate()


async def test_concurrent_clients_never_lose_an_update(
    store: Store, store_url: str, request: pytest.FixtureRequest
) -> None:
    """16 clients add and remove their own taints on one worker, 50 rounds each.

    The worker's lease outlives the test however slow a loaded machine makes the clients
    (nothing keeps it alive here: the subject is the compare-and-swap, not the lease)."""
    clients, rounds = 16, 50
    worker = await registered(store, ttl=3600, taints=["base"], topology={"zone": "a"})
    if store_url.startswith("memory"):
        outputs = await asyncio.gather(
            *(_client_in_process(store, worker.key, i, rounds) for i in range(clients))
        )
    else:
        procs = [
            spawn("tests.discovery.taint_client", store_url, worker.key, str(i), str(rounds))
            for i in range(clients)
        ]
        outputs = []
        try:
            for proc in procs:
                out, err = await asyncio.to_thread(proc.communicate, timeout=100)
                assert proc.returncode == 0, err
                outputs.append(out)
        finally:  # a failed or timed-out client leaves none of the others running
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    expected = {"base", "dynamo.topology/zone=a"}
    applied = conflicts = 0
    for out in outputs:
        for line in out.splitlines():
            result = json.loads(line)
            if not result["ok"]:
                conflicts += 1
                assert "lost the compare-and-swap race 8 times" in result["error"]
                continue
            applied += 1
            (expected.add if result["op"] == "add" else expected.discard)(result["taint"])
    assert applied + conflicts == clients * (rounds + rounds // 2)
    final = WorkerRecord.from_bytes(await stored_bytes(store, worker.key))
    assert set(final.taints) == expected
    request.node.user_properties.append(("conflicts", conflicts))


async def _client_in_process(store: Store, key: str, index: int, rounds: int) -> str:
    lines = []
    for r in range(rounds):
        taint = f"c{index}/r{r}"
        for name in ["add", "remove"] if r % 2 else ["add"]:
            op = TaintUpdate.add([taint]) if name == "add" else TaintUpdate.remove([taint])
            try:
                await update_taints(store, key, op)
                lines.append(json.dumps({"op": name, "taint": taint, "ok": True, "error": None}))
            except ConflictError as exc:
                lines.append(
                    json.dumps({"op": name, "taint": taint, "ok": False, "error": str(exc)})
                )
            await asyncio.sleep(0)
    return "\n".join(lines)
