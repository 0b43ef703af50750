"""An update whose wait runs long, against an in-process dynamod on a Dynamo fleet whose
worker answers ok and stores nothing (``fake_worker``'s ``silent``): the daemon waits for
the store to show the change, and the client's deadline outlasts that wait, so the
caller gets the daemon's own answer (what the store shows), never "cannot reach". An
update cancelled on the way still leaves its audit line."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dynamod.client import AsyncClient
from dynamod.client.endpoint import Credentials
from dynamod.errors import WorkerUnavailableError
from dynamod.settings import DaemonSettings
from dynamod.store.dynamo import DynamoStore
from dynamod.store.etcd import EtcdStore
from dynamod.taints import TaintUpdate
from dynamod.targets import Target
from tests.daemon.helpers import running_daemon, settings_for
from tests.dynamo.fake_worker import FakeDynamoWorker
from tests.support.eventually import eventually

pytestmark = pytest.mark.timeout(120)
SILENT = 0x13B0A2323C378618


@pytest.fixture
async def silent(
    dynamo_etcd: EtcdStore, dynamo_url: str, tmp_path: Path
) -> AsyncIterator[tuple[DaemonSettings, FakeDynamoWorker]]:
    worker = await FakeDynamoWorker(dynamo_etcd, SILENT, mode="silent").start()
    store = await DynamoStore.open(dynamo_url)
    try:
        settings = settings_for(store, tmp_path)
        async with running_daemon(store, settings):
            yield settings, worker
    finally:
        await store.aclose()
        await worker.stop()


def quick_client(settings: DaemonSettings) -> AsyncClient:
    """A client whose deadline (2 s) is far shorter than the daemon's wait (10 s)."""
    return AsyncClient(settings.listen[0], credentials=Credentials(), timeout=2)


def audit_lines(settings: DaemonSettings) -> list[dict[str, object]]:
    assert settings.audit_log is not None
    if not settings.audit_log.exists():
        return []
    return [json.loads(line) for line in settings.audit_log.read_text().splitlines()]


async def test_a_long_wait_reports_the_daemons_own_error(
    silent: tuple[DaemonSettings, FakeDynamoWorker],
) -> None:
    settings, worker = silent
    async with quick_client(settings) as client:
        with pytest.raises(WorkerUnavailableError, match="the store shows"):
            await client.update_taints(TaintUpdate.add(["gpu"]), Target(worker.id))
    (line,) = audit_lines(settings)
    assert line["outcome"] == "WorkerUnavailableError"


async def test_a_bulk_update_waits_for_each_outcome_past_the_deadline(
    silent: tuple[DaemonSettings, FakeDynamoWorker],
) -> None:
    settings, worker = silent
    async with quick_client(settings) as client:
        (outcome,) = [
            change
            async for change in client.stream_update_taints(
                TaintUpdate.add(["gpu"]), Target(selector=f"id={worker.id}")
            )
        ]
    assert outcome.error is not None and "the store shows" in outcome.error.message


async def test_an_update_cancelled_on_the_way_leaves_its_audit_line(
    silent: tuple[DaemonSettings, FakeDynamoWorker],
) -> None:
    settings, worker = silent
    async with quick_client(settings) as client:
        update = asyncio.create_task(
            client.update_taints(TaintUpdate.add(["gpu"]), Target(worker.id))
        )

        async def posted() -> bool:
            return worker.requests == 1

        await eventually(posted, what="the worker got the update")
        update.cancel()
        with pytest.raises(asyncio.CancelledError):
            await update

    async def cancelled() -> bool:
        return [line["outcome"] for line in audit_lines(settings)] == ["cancelled"]

    await eventually(cancelled, what="the cancelled update's audit line")
    (line,) = audit_lines(settings)
    assert line["worker"] == worker.id and line["taints"] == ["gpu"]
    assert "may or may not hold the change" in str(line["error"])
