"""The surfaces operators and readers reach, misused: with real ``dynamo-worker`` and
``dynamod`` processes on a file store.

* The worker's taint route (Dynamo's ``POST /engine/update/model_taints``) refuses a request
  with two ``Authorization`` headers (400, audited, nothing written), token or no token:
  which one counted would depend on who read them.
* No taint that reads as the operator's cordon without being it — another case, a
  confusable letter, a value — can be set, on the route or through dynamod: routers match
  the cordon exactly, so an operator reading ``DYNAMO.IO/cordoned`` would be misled.
* Every audit line of a caller of dynamod's gRPC API names where the call came from: the
  TCP peer's address (the unix socket's callers say ``unix:``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from multidict import CIMultiDict

from dynamod.records import WorkerRecord
from dynamod.store import Store, open_store
from dynamod.taints import CORDONED
from tests.support.processes import Proc, daemon, run_ctl, running, worker
from tests.support.servers import free_port
from tests.worker.test_route_parity import TOKENS, audit_lines, taints_seen

pytestmark = pytest.mark.timeout(120)

LOOK_ALIKES = [
    "DYNAMO.IO/cordoned",
    "dynamo.io/CORDONED",
    "dynamo.io/\u0441ordoned",  # Cyrillic es
    "dynamo.io/cord\u043ened",  # Cyrillic o
    "\uff44ynamo.io/cordoned",  # fullwidth d
    "dynamo.io/cordoned=no",
]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with await open_store((tmp_path / "store").as_uri()) as opened:
        yield opened


async def stored_taints(store: Store, proc: Proc) -> tuple[str, ...]:
    entry = await store.get(proc.field("key"))
    assert entry is not None
    return WorkerRecord.from_bytes(entry.value).taints


async def post(
    proc: Proc, body: object, headers: CIMultiDict[str] | None = None
) -> tuple[int, dict[str, object]]:
    url = proc.field("system") + "/engine/update/model_taints"
    async with (
        aiohttp.ClientSession() as http,
        http.post(url, json=body, headers=headers or CIMultiDict()) as response,
    ):
        return response.status, await response.json()


@pytest.mark.parametrize("tokens", [True, False], ids=["tokens", "open"])
async def test_the_worker_route_refuses_two_authorization_headers(
    store: Store, tmp_path: Path, tokens: bool
) -> None:
    (tmp_path / "tokens.toml").write_text(TOKENS)
    audit = tmp_path / "audit.log"
    args = ["--taint", "pool=a", "--audit-log", str(audit)]
    args += ["--token-file", str(tmp_path / "tokens.toml")] if tokens else []
    async with running(worker(store.url, *args)) as proc:
        two = CIMultiDict(
            [("Authorization", "Bearer viewer-secret-1"), ("Authorization", "Bearer ops-secret-1")]
        )
        status, reply = await post(proc, {"taints": ["pool=b"]}, two)
        assert (status, reply) == (
            400,
            {
                "error": "Bad request",
                "message": "2 Authorization headers were sent; send exactly one bearer token",
            },
        )
        assert "pool=a" in await stored_taints(store, proc)
        one = CIMultiDict([("Authorization", "Bearer ops-secret-1")])
        assert (await post(proc, {"taints": ["pool=b"]}, one))[0] == 200
        assert await proc.stop() == 0
    outcomes = [(line["outcome"], line["taints"]) for line in audit_lines(audit)]
    assert outcomes == [("InvalidInputError", None), ("ok", ["pool=b"])]


async def test_no_taint_that_reads_as_the_cordon_can_be_set(store: Store, tmp_path: Path) -> None:
    """On the route (400, audited, nothing written) and through dynamod (dynamoctl exits 1
    with the rule); the real cordon survives a look-alike sent in its place."""
    socket, audit = tmp_path / "d.sock", tmp_path / "worker-audit.log"
    async with (
        running(worker(store.url, "--taint", "pool=a", "--audit-log", str(audit))) as proc,
        running(daemon(store.url, socket)),
    ):
        worker_id = proc.field("id")
        for taint in LOOK_ALIKES:
            status, reply = await post(proc, {"taints": ["pool=a", taint]})
            assert (status, reply["error"]) == (400, "Bad request"), taint
            assert "reads as the operator's cordon 'dynamo.io/cordoned'" in str(reply["message"])
            code, err = await run_ctl(socket, "taints", "add", worker_id, taint)
            assert code == 1, err
            assert "reads as the operator's cordon" in err
        assert await stored_taints(store, proc) == ("pool=a",)

        assert (await run_ctl(socket, "workers", "cordon", worker_id))[0] == 0
        await taints_seen(socket, worker_id, {CORDONED})
        status, _ = await post(proc, {"taints": ["DYNAMO.IO/cordoned"]})
        assert status == 400
        assert await stored_taints(store, proc) == (CORDONED, "pool=a")
        assert await proc.stop() == 0
    refused = [line for line in audit_lines(audit) if line["outcome"] != "ok"]
    assert len(refused) == len(LOOK_ALIKES) + 1


async def test_every_audit_line_of_a_tcp_caller_names_its_peer(
    store: Store, tmp_path: Path
) -> None:
    (tmp_path / "tokens.toml").write_text(TOKENS)
    (tmp_path / "ops").write_text("ops-secret-1")
    (tmp_path / "viewer").write_text("viewer-secret-1")
    socket, port = tmp_path / "d.sock", free_port()
    tcp = ("--listen", f"127.0.0.1:{port}", "--tokens-file", str(tmp_path / "tokens.toml"))
    async with (
        running(worker(store.url, "--taint", "pool=a")) as proc,
        running(daemon(store.url, socket, *tcp)) as dynamod,
    ):
        worker_id = proc.field("id")
        for token in ("ops", "viewer"):
            code, _ = await run_ctl(
                socket,
                "--endpoint", f"127.0.0.1:{port}", "--token-file", str(tmp_path / token),
                "taints", "add", worker_id, f"by/{token}",
            )  # fmt: skip
            assert code == (0 if token == "ops" else 1)
        assert (await run_ctl(socket, "taints", "add", worker_id, "by/socket"))[0] == 0
        assert await dynamod.stop() == 0
    lines = [json.loads(x) for x in (tmp_path / "audit.log").read_text().splitlines()]
    assert [(x["caller"], x["outcome"]) for x in lines] == [
        ("ops", "ok"),
        ("viewer", "PermissionDeniedError"),
        ("unix-socket", "ok"),
    ]
    for line in lines[:2]:
        host, _, peer_port = str(line["peer"]).rpartition(":")
        assert (host, peer_port.isdigit()) == ("ipv4:127.0.0.1", True), line
    assert str(lines[2]["peer"]).startswith("unix:")
