"""Who may change what, with real processes: the operator's cordon survives the worker's own
taint route (a replace that leaves it out keeps it; the route can neither add nor remove
it), and the limits on taints per worker refuse growth past them, on the route and through
dynamod, as permanent errors that change nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from dynamod.client import AsyncClient, Credentials
from dynamod.errors import TaintLimitError
from dynamod.records import WorkerRecord
from dynamod.store import Store
from dynamod.taints import CORDONED
from tests.support.processes import daemon, run_ctl, running, worker
from tests.worker.test_route_parity import audit_lines, taints_seen
from tests.worker.test_worker_process import post_taints, stored

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_the_worker_route_keeps_the_operators_cordon(
    shared_store: Store, shared_store_url: str, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    socket, audit = tmp_path / "dynamod.sock", tmp_path / "worker-audit.log"
    async with (
        running(worker(shared_store_url, "--taint", "pool=a", "--audit-log", str(audit))) as proc,
        running(daemon(shared_store_url, socket)),
    ):
        worker_id = proc.field("id")
        await taints_seen(socket, worker_id, {"pool=a"})
        assert (await run_ctl(socket, "workers", "cordon", worker_id))[0] == 0

        status, reply = await post_taints(http, proc, {"taints": ["pool=b"]})
        assert (status, reply) == (200, {"status": "ok", "taints": [CORDONED, "pool=b"]})
        assert WorkerRecord.from_bytes(await stored(shared_store, proc)).taints == (
            CORDONED, "pool=b"
        )  # fmt: skip

        status, _ = await post_taints(http, proc, {"taints": []})
        assert status == 200
        assert WorkerRecord.from_bytes(await stored(shared_store, proc)).taints == (CORDONED,)

        assert (await run_ctl(socket, "workers", "uncordon", worker_id))[0] == 0
        await taints_seen(socket, worker_id, set())
        before = await stored(shared_store, proc)
        status, reply = await post_taints(http, proc, {"taints": [CORDONED]})
        assert (status, reply["error"]) == (403, "Forbidden")
        assert f"taint '{CORDONED}' is the operator's" in str(reply["message"])
        assert await stored(shared_store, proc) == before
        assert await proc.stop() == 0
    outcomes = [(line["taints"], line["outcome"], line["after"]) for line in audit_lines(audit)]
    assert outcomes == [
        (["pool=b"], "ok", [CORDONED, "pool=b"]),
        ([], "ok", [CORDONED]),
        ([CORDONED], "PermissionDeniedError", None),
    ]


async def test_the_route_refuses_growth_past_the_workers_limits(
    shared_store: Store, shared_store_url: str, http: aiohttp.ClientSession
) -> None:
    args = ("--taint", "a", "--max-taints", "3", "--max-taint-bytes", "2048")
    async with running(worker(shared_store_url, *args)) as proc:
        before = await stored(shared_store, proc)
        status, reply = await post_taints(http, proc, {"taints": ["a", "b", "c", "d"]})
        assert (status, reply["error"]) == (400, "Bad request")
        assert reply["message"] == (
            "the update would leave the worker 4 taints; the limit is 3 taints per worker "
            "(the worker holds 1)"
        )
        big = ["x" * 1000, "y" * 1000, "z" * 1000]
        status, reply = await post_taints(http, proc, {"taints": big})
        assert (status, reply["message"]) == (
            400,
            "the update would leave the worker 3003 bytes of taints; the limit is 2048 bytes "
            "of taints per worker (the worker holds 2)",
        )
        assert await stored(shared_store, proc) == before
        status, _ = await post_taints(http, proc, {"taints": ["a", "b", "c"]})
        assert status == 200


async def test_dynamod_refuses_growth_past_its_limits_as_a_permanent_error(
    shared_store: Store, shared_store_url: str, tmp_path: Path
) -> None:
    socket = tmp_path / "dynamod.sock"
    async with (
        running(worker(shared_store_url, "--taint", "a")) as proc,
        running(daemon(shared_store_url, socket, DYNAMO_MAX_TAINTS="2")),
    ):
        worker_id = proc.field("id")
        await taints_seen(socket, worker_id, {"a"})
        before = await stored(shared_store, proc)
        async with AsyncClient(f"unix://{socket}", credentials=Credentials()) as client:
            with pytest.raises(TaintLimitError, match="the limit is 2 taints per worker") as info:
                await client.add_taints(worker_id, ["b", "c"])
        assert not info.value.retryable
        code, out = await run_ctl(socket, "taints", "add", worker_id, "b", "c", "d")
        assert code == 1
        assert "would leave the worker 4 taints; the limit is 2 taints per worker" in out
        assert await stored(shared_store, proc) == before
