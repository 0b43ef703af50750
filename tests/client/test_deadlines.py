"""A deadline means "cannot reach dynamod" only when dynamod cannot be reached: a daemon
that is connected but answers after the deadline gets an error that says it was reached
and may still carry the call out (``AnswerTimeoutError``, exit 1 in dynamoctl), not the
advice to check that it is running."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dynamod.client import AsyncClient, Credentials
from dynamod.errors import AnswerTimeoutError, UnreachableError
from dynamod.settings import DaemonSettings
from dynamod.store import open_store
from tests.daemon.helpers import add_worker, running_daemon, settings_for


@pytest.fixture
async def settings(tmp_path: Path) -> AsyncIterator[DaemonSettings]:
    async with await open_store("memory://") as store:
        for n in range(200):
            await add_worker(store, instance_id=f"{n:016x}")
        chosen = settings_for(store, tmp_path)
        async with running_daemon(store, chosen):
            yield chosen


async def test_a_late_answer_from_a_connected_daemon_is_not_unreachable(
    settings: DaemonSettings,
) -> None:
    async with AsyncClient(settings.listen[0], credentials=Credentials(), timeout=10) as client:
        await client.status()  # connected
        client.timeout = 1e-6  # no answer can come this fast
        with pytest.raises(AnswerTimeoutError) as caught:
            await client.list_workers()
    assert not isinstance(caught.value, UnreachableError)
    assert "is reachable but did not answer within 1e-06 s" in str(caught.value)


async def test_no_daemon_at_the_endpoint_is_unreachable(tmp_path: Path) -> None:
    nowhere = f"unix://{tmp_path / 'none.sock'}"
    async with AsyncClient(nowhere, credentials=Credentials(), timeout=2) as client:
        with pytest.raises(UnreachableError, match="cannot reach dynamod at"):
            await client.status()
