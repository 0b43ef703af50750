"""An in-process dynamod on real sockets, for API tests."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from dynamod.client import AsyncClient, Credentials
from dynamod.daemon import Daemon
from dynamod.discovery.registration import register
from dynamod.records import WorkerRecord
from dynamod.settings import DaemonSettings
from dynamod.store import Store
from tests.support.factories import make_record


def settings_for(store: Store, tmp_path: Path, **overrides: Any) -> DaemonSettings:
    base = DaemonSettings(
        store=store.url,
        listen=(f"unix://{tmp_path / 'dynamod.sock'}",),
        http="127.0.0.1:0",
        audit_log=tmp_path / "audit.log",
        grace=2.0,
        replica_id="test-replica",
    )
    return dataclasses.replace(base, **overrides)


@contextlib.asynccontextmanager
async def running_daemon(store: Store, settings: DaemonSettings) -> AsyncIterator[Daemon]:
    """Run a Daemon on ``store`` until the block ends, then stop it gracefully."""
    daemon = Daemon(settings, store=store)
    task = asyncio.create_task(daemon.run(), name="daemon under test")
    try:
        async with asyncio.timeout(20):
            ready = asyncio.create_task(daemon.ready.wait())
            await asyncio.wait([ready, task], return_when=asyncio.FIRST_COMPLETED)
            ready.cancel()
            if task.done():
                task.result()
                raise AssertionError("the daemon exited before it was ready")
        yield daemon
    finally:
        daemon.stop()
        async with asyncio.timeout(20):
            await task


def client_for(
    settings: DaemonSettings, *, endpoint: str | None = None, token: str | None = None
) -> AsyncClient:
    return AsyncClient(
        endpoint or settings.listen[0], credentials=Credentials(token=token), timeout=10
    )


async def add_worker(store: Store, **kwargs: Any) -> WorkerRecord:
    record = make_record(**kwargs)
    stored, _ = await register(store, record, await store.grant(60))
    return stored
