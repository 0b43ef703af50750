"""Every RPC over a real unix socket, on the memory store and on a real etcd."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from dynamod.client import AsyncClient
from dynamod.daemon import Daemon
from dynamod.errors import (
    AmbiguousWorkerError,
    ConflictError,
    InvalidInputError,
    RevisionMismatchError,
    SelectorError,
    TaintError,
    WorkerNotFoundError,
)
from dynamod.records import WorkerRecord
from dynamod.reports import EventInfo
from dynamod.store import Store, open_store
from dynamod.store.base import LeaseArg
from dynamod.store.memory import MemoryStore
from dynamod.taints import TaintUpdate
from dynamod.targets import Target
from tests.conftest import backend_url
from tests.daemon.helpers import add_worker, client_for, running_daemon, settings_for

pytestmark = pytest.mark.timeout(90)

RESERVED = "taint 'dynamo.topology/zone=b' uses reserved prefix 'dynamo.topology/'"


@pytest.fixture(params=["memory", "etcd"])
async def api_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    async with await open_store(backend_url(request.param, request, tmp_path)) as store:
        yield store


@pytest.fixture
async def fleet(api_store: Store) -> list[WorkerRecord]:
    return [
        await add_worker(
            api_store, instance_id="aa01", taints=["capacity/fast"], topology={"zone": "a"}
        ),
        await add_worker(api_store, instance_id="aa02", taints=["capacity/slow", "pool=batch"]),
        await add_worker(api_store, instance_id="bb01", model="mistral", taints=["capacity/fast"]),
    ]


@pytest.fixture
async def daemon(
    api_store: Store, fleet: list[WorkerRecord], tmp_path: Path
) -> AsyncIterator[Daemon]:
    async with running_daemon(api_store, settings_for(api_store, tmp_path)) as running:
        yield running


@pytest.fixture
async def client(daemon: Daemon) -> AsyncIterator[AsyncClient]:
    async with client_for(daemon.settings) as opened:
        yield opened


async def test_list_workers_with_filters(client: AsyncClient, fleet: list[WorkerRecord]) -> None:
    workers, revision = await client.list_workers()
    assert [w.id for w in workers] == ["aa01", "aa02", "bb01"]
    assert revision >= max(w.revision for w in workers) > 0
    assert workers[0].record.taints == ("capacity/fast", "dynamo.topology/zone=a")
    assert workers[0].record == fleet[0]
    assert [w.id for w in (await client.list_workers(model="llama"))[0]] == ["aa01", "aa02"]
    fast, _ = await client.list_workers(selector="capacity/fast,!dynamo.topology/zone=a")
    assert [w.id for w in fast] == ["bb01"]
    by_field, _ = await client.list_workers(selector="model=llama,!pool=batch")
    assert [w.id for w in by_field] == ["aa01"]
    assert (await client.list_workers(namespace="elsewhere"))[0] == []


async def test_bad_selector_is_invalid_argument(client: AsyncClient) -> None:
    with pytest.raises(SelectorError, match="has an empty term"):
        await client.list_workers(selector="a,,b")


async def test_get_worker_by_id_prefix_and_key(
    client: AsyncClient, fleet: list[WorkerRecord]
) -> None:
    assert (await client.get_worker("aa01")).record == fleet[0]
    assert (await client.get_worker("bb")).id == "bb01"
    assert (await client.get_worker(fleet[1].key)).id == "aa02"
    with pytest.raises(AmbiguousWorkerError, match="'aa' is ambiguous: it matches 2 workers"):
        await client.get_worker("aa")
    with pytest.raises(WorkerNotFoundError, match="no worker with id 'zz'"):
        await client.get_worker("zz")


async def test_update_taints_on_one_worker(client: AsyncClient, api_store: Store) -> None:
    (change,) = await client.update_taints(TaintUpdate.add(["pool=b"]), Target(worker="aa01"))
    assert change.after == ("capacity/fast", "dynamo.topology/zone=a", "pool=b")
    assert (change.added, change.removed) == (("pool=b",), ())
    (change,) = await client.update_taints(TaintUpdate.replace(["x"]), Target(worker="aa01"))
    assert change.after == ("dynamo.topology/zone=a", "x")
    assert set(change.removed) == {"capacity/fast", "pool=b"}
    (change,) = await client.update_taints(TaintUpdate.remove([], ["x"]), Target(worker="aa01"))
    assert change.after == ("dynamo.topology/zone=a",)
    (change,) = await client.update_taints(TaintUpdate.clear(), Target(worker="aa01"))
    assert not change.changed
    entry = await api_store.get(change.key)
    assert entry is not None
    assert WorkerRecord.from_bytes(entry.value).taints == ("dynamo.topology/zone=a",)
    assert entry.revision == change.revision


async def test_invalid_and_reserved_taints_are_invalid_argument(
    client: AsyncClient, api_store: Store
) -> None:
    before = await api_store.list("")
    with pytest.raises(TaintError) as caught:
        await client.update_taints(
            TaintUpdate.add(["dynamo.topology/zone=b"]), Target(worker="aa01")
        )
    assert str(caught.value) == RESERVED
    with pytest.raises(TaintError, match="has leading or trailing whitespace"):
        await client.update_taints(
            TaintUpdate.replace(["bad taint "]), Target(selector="model=llama")
        )
    with pytest.raises(TaintError, match=r"looks like reserved prefix 'dynamo\.topology/'"):
        await client.update_taints(
            TaintUpdate.add(["Dynamo.Topology/zone=b"]), Target(worker="aa01")
        )
    with pytest.raises(InvalidInputError, match="add needs at least one taint"):
        await client.update_taints(TaintUpdate.add([]), Target(worker="aa01"))
    assert (await api_store.list(""))[0] == before[0]


async def test_unknown_worker_is_not_found(client: AsyncClient) -> None:
    with pytest.raises(WorkerNotFoundError):
        await client.update_taints(TaintUpdate.add(["a"]), Target(worker="ffff"))


async def test_stale_expected_revision_is_failed_precondition(client: AsyncClient) -> None:
    worker = await client.get_worker("aa01")
    await client.update_taints(TaintUpdate.add(["a"]), Target(worker="aa01"))
    with pytest.raises(RevisionMismatchError, match=f"not the expected revision {worker.revision}"):
        await client.update_taints(
            TaintUpdate.add(["b"]), Target(worker="aa01", expect_revision=worker.revision)
        )
    fresh = await client.get_worker("aa01")
    (change,) = await client.update_taints(
        TaintUpdate.add(["b"]), Target(worker="aa01", expect_revision=fresh.revision)
    )
    assert "b" in change.after


async def test_bulk_update_by_selector_and_all(client: AsyncClient) -> None:
    changes = await client.update_taints(
        TaintUpdate.add(["maint"]), Target(selector="capacity/fast")
    )
    assert sorted(c.worker for c in changes) == ["aa01", "bb01"]
    assert all(c.error is None and c.added == ("maint",) for c in changes)
    changes = await client.update_taints(TaintUpdate.remove(["maint"]), Target(all=True))
    assert sorted(c.worker for c in changes) == ["aa01", "aa02", "bb01"]
    assert sum(c.changed for c in changes) == 2
    with pytest.raises(InvalidInputError, match="needs a single worker"):
        await client.update_taints(
            TaintUpdate.add(["a"]), Target(selector="capacity/fast", expect_revision=1)
        )


async def test_dry_run_writes_nothing(client: AsyncClient, api_store: Store) -> None:
    before = await api_store.list("")
    (change,) = await client.update_taints(
        TaintUpdate.replace(["new"]), Target(worker="aa02"), dry_run=True
    )
    assert change.after == ("new",)
    assert change.removed == ("capacity/slow", "pool=batch")
    assert (await api_store.list(""))[0] == before[0]


async def test_every_mutation_writes_one_audit_line(client: AsyncClient, daemon: Daemon) -> None:
    await client.update_taints(TaintUpdate.add(["a"]), Target(worker="aa01"))
    await client.update_taints(TaintUpdate.add(["b"]), Target(selector="model=llama"))
    await client.update_taints(TaintUpdate.add(["c"]), Target(worker="aa01"), dry_run=True)
    with pytest.raises(TaintError):
        await client.update_taints(TaintUpdate.add(["bad\ttaint"]), Target(worker="aa01"))
    assert daemon.settings.audit_log is not None
    lines = [json.loads(line) for line in daemon.settings.audit_log.read_text().splitlines()]
    summary = [(line["worker"], line["action"], line["taints"]) for line in lines]
    assert summary[0] == ("aa01", "add", ["a"])
    # the two workers of one bulk operation are updated concurrently, in either order
    assert sorted(summary[1:]) == [("aa01", "add", ["b"]), ("aa02", "add", ["b"])]
    first = lines[0]
    assert first["caller"] == "unix-socket"
    assert first["before"] == ["capacity/fast", "dynamo.topology/zone=a"]
    assert first["after"] == ["a", "capacity/fast", "dynamo.topology/zone=a"]
    assert first["outcome"] == "ok"
    assert isinstance(first["revision"], int)
    assert first["time"].endswith("+00:00")
    # sent when it left for the store, after the checks: not after the line was written
    assert all(line["sent"] <= line["time"] for line in lines)


async def test_tail_events_live_and_replayed(client: AsyncClient) -> None:
    _, revision = await client.list_workers()
    events: list[EventInfo] = []
    started = asyncio.Event()

    async def tail() -> None:
        async for event in client.tail_events(selector="model=llama"):
            events.append(event)
            started.set()
            if event.kind == "TAINTS":
                return

    async with asyncio.timeout(10):
        async with asyncio.TaskGroup() as group:
            group.create_task(tail())
            await started.wait()
            await client.update_taints(TaintUpdate.add(["other"]), Target(worker="bb01"))
            await client.update_taints(TaintUpdate.add(["live"]), Target(worker="aa02"))
    assert events[0].kind == "RESYNC"
    assert [w.id for w in events[0].workers] == ["aa01", "aa02"]
    assert (events[-1].kind, events[-1].added, events[-1].worker and events[-1].worker.id) == (
        "TAINTS", ("live",), "aa02",
    )  # fmt: skip
    replay = [e async for e in client.tail_events(since=revision, follow=False)]
    assert [(e.kind, e.worker.id if e.worker else "") for e in replay] == [
        ("TAINTS", "bb01"),
        ("TAINTS", "aa02"),
    ]
    old = [e async for e in client.tail_events(since=-100, follow=False)]
    assert [e.kind for e in old] == ["RESYNC"]


async def test_explain_ranks_and_excludes(client: AsyncClient) -> None:
    info = await client.explain("llama", required=["capacity/fast"], prompt="hello world")
    assert info.chosen == "aa01"
    by_id = {c.worker.id: c for c in info.candidates}
    assert by_id["aa01"].rank == 1
    assert by_id["aa01"].eligible
    assert not by_id["aa02"].eligible
    assert "missing capacity/fast" in by_id["aa02"].reason
    nothing = await client.explain("llama", required=["capacity/none"])
    assert nothing.chosen == ""
    assert "capacity/none" in nothing.summary


async def test_status_reports_the_daemon(client: AsyncClient, api_store: Store) -> None:
    status = await client.status()
    assert status.workers == 3
    assert status.store_url == api_store.url
    assert status.store_healthy
    assert status.replica_id == "test-replica"
    assert status.state == "serving"


async def test_health_and_reflection(daemon: Daemon) -> None:
    async with grpc.aio.insecure_channel(daemon.settings.listen[0]) as channel:
        # The typeshed stubs describe the sync stubs; these calls go over an aio channel.
        health: Any = health_pb2_grpc.HealthStub(channel)
        reply = await health.Check(health_pb2.HealthCheckRequest(service="dynamo.v1.TaintService"))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        stub: Any = reflection_pb2_grpc.ServerReflectionStub(cast(Any, channel))
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        async for response in stub.ServerReflectionInfo(iter([request])):
            names = {s.name for s in response.list_services_response.service}
            break
    assert {"dynamo.v1.WorkerService", "dynamo.v1.TaintService", "grpc.health.v1.Health"} <= names


async def test_socket_is_mode_0660(daemon: Daemon) -> None:
    path = Path(daemon.settings.listen[0].removeprefix("unix://"))
    assert path.stat().st_mode & 0o777 == 0o660


class RacingMemoryStore(MemoryStore):
    """Loses every compare-and-swap to another writer while ``racing``."""

    racing = False

    async def put(
        self, key: str, value: bytes, *, expect: int | None = None, lease: LeaseArg = None
    ) -> int:
        if self.racing and expect is not None:
            current = await self.get(key)
            assert current is not None
            await super().put(key, current.value, lease="keep")
        return await super().put(key, value, expect=expect, lease=lease)


async def test_lost_races_are_aborted(tmp_path: Path) -> None:
    store = RacingMemoryStore()
    await add_worker(store, instance_id="cc01")
    settings = settings_for(store, tmp_path)
    async with running_daemon(store, settings), client_for(settings) as client:
        store.racing = True
        with pytest.raises(ConflictError, match="8 attempts"):
            await client.update_taints(TaintUpdate.add(["a"]), Target(worker="cc01"))
        (change,) = await client.update_taints(
            TaintUpdate.add(["a"]), Target(selector="model=llama")
        )
        assert change.error is not None
        assert change.error.code == "ABORTED"
    await store.aclose()
