"""``WaitDrained`` under a hostile caller, with a real daemon (issue 28): a wait takes a
stream slot as ``TailEvents`` does, so 1,000 waits from one caller leave
``max_streams_per_caller`` open and refuse the rest with ``RESOURCE_EXHAUSTED``; a wait
needs a write token (the drain it follows is a write)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from dynamod.client import AsyncClient, Credentials
from dynamod.errors import PermissionDeniedError, StreamLimitError
from dynamod.targets import Target
from tests.support.eventually import eventually
from tests.support.processes import daemon, running
from tests.support.servers import free_port

pytestmark = pytest.mark.timeout(240)

WAITS = 1000
PER_CALLER = 16
TOKENS = """
[[token]]
name = "operator"
secret = "operator-secret-1"
role = "write"

[[token]]
name = "viewer"
secret = "viewer-secret-1"
"""
FUTURE = 10**15
"""An ``after_revision`` the store never reaches: the wait holds until it is cancelled."""


async def first(client: AsyncClient) -> object:
    waits = client.wait_drained(Target(all=True), after_revision=FUTURE)
    async with contextlib.aclosing(waits):
        return await anext(waits)


async def test_a_thousand_drain_waits_from_one_caller_take_their_slots_only(
    tmp_path: Path,
) -> None:
    (tmp_path / "tokens.toml").write_text(TOKENS)
    url, socket, port = (tmp_path / "store").as_uri(), tmp_path / "d.sock", free_port()
    tcp = ("--listen", f"127.0.0.1:{port}", "--tokens-file", str(tmp_path / "tokens.toml"))
    proc = daemon(url, socket, *tcp)
    async with running(proc):
        operator = Credentials(token="operator-secret-1")
        async with AsyncClient(f"127.0.0.1:{port}", credentials=operator, timeout=60) as client:
            waits = [asyncio.create_task(first(client)) for _ in range(WAITS)]
            try:
                refused = await eventually(
                    lambda: asyncio.sleep(0, [w for w in waits if w.done()]),
                    lambda done: len(done) >= WAITS - PER_CALLER,
                    within=120,
                    what="the waits past the limit refused",
                )
                assert len(refused) == WAITS - PER_CALLER
                errors = {type(w.exception()) for w in refused}
                assert errors == {StreamLimitError}
                said = str(refused[0].exception())
                assert f"max_streams_per_caller = {PER_CALLER}" in said
                with pytest.raises(StreamLimitError):
                    await anext(aiter(client.tail_events()))  # one budget for both kinds
                assert sum(not w.done() for w in waits) == PER_CALLER
            finally:
                for wait in waits:
                    wait.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
            await eventually(  # the slots are free again once the waits are cancelled
                lambda: _tail_opens(client), lambda ok: ok, within=30, what="a slot"
            )
        viewer = Credentials(token="viewer-secret-1")
        async with AsyncClient(f"127.0.0.1:{port}", credentials=viewer, timeout=30) as client:
            with pytest.raises(PermissionDeniedError, match="waiting for a drain needs a write"):
                await first(client)
    proc.assert_clean_stderr()


async def _tail_opens(client: AsyncClient) -> bool:
    events = client.tail_events()
    async with contextlib.aclosing(events):
        try:
            await anext(events)
        except StreamLimitError:
            return False
    return True
