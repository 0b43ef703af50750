"""The worker's taint route next to Dynamo's, with real processes: what Dynamo 1.6 accepts
is stored and routed, the method is POST only, every change leaves an audit line naming
the peer and the token, and code inside a worker has Dynamo's ``update_model_taints``."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from dynamod.client import AsyncClient, Credentials
from dynamod.records import WorkerRecord
from dynamod.store import Store
from tests.support.processes import Proc, daemon, dynamoctl, env, running, worker
from tests.worker.test_worker_process import post_taints, stored

pytestmark = pytest.mark.timeout(120)

TOPOLOGY = "dynamo.topology/zone=a"
DYNAMO_ACCEPTS = [
    "gpu:h100",
    "Region/us=1",
    "dynamo.policy/version=run%2Fa:step%3A17",  # the percent-encoded form Dynamo generates
    "pool batch",
    "gpu,h100",
    "区域=东",
    "k=" + "v" * 1022,  # 1024 bytes: the bound
]


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def taints_seen(socket: Path, worker_id: str, taints: set[str]) -> None:
    """Wait until dynamod's view shows ``taints`` on the worker (its event stream)."""
    async with AsyncClient(f"unix://{socket}", credentials=Credentials()) as client:
        async with asyncio.timeout(30):
            async for event in client.events():
                shown = [w for w in (*event.workers, event.worker) if w and w.id == worker_id]
                if shown and taints <= set(shown[0].taints):
                    return


async def test_what_dynamo_accepts_is_stored_selected_and_routed(
    shared_store: Store, shared_store_url: str, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    socket = tmp_path / "dynamod.sock"
    async with (
        running(worker(shared_store_url, "--topology", "zone=a")) as proc,
        running(daemon(shared_store_url, socket)) as dynamod,
    ):
        status, reply = await post_taints(http, proc, {"taints": DYNAMO_ACCEPTS})
        assert (status, reply) == (200, {"status": "ok", "taints": sorted(DYNAMO_ACCEPTS)})
        record = WorkerRecord.from_bytes(await stored(shared_store, proc))
        assert record.taints == tuple(sorted([*DYNAMO_ACCEPTS, TOPOLOGY]))
        await taints_seen(socket, proc.field("id"), set(DYNAMO_ACCEPTS))

        body = {
            "model": "llama",
            "prompt": "hello",
            "max_tokens": 2,
            "nvext": {"routing_constraints": {"required_taints": DYNAMO_ACCEPTS[:6]}},
        }
        async with http.post(dynamod.field("http") + "/v1/completions", json=body) as answer:
            assert answer.status == 200, await answer.text()
            assert answer.headers["x-dynamo-worker-id"] == proc.field("id")

        selector = '"gpu,h100",gpu:h100,"pool batch",!"Region/us=2"'
        argv = dynamoctl("-e", f"unix://{socket}", "workers", "ls", "-l", selector, "-o", "json")
        listed = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env(),
        )  # fmt: skip
        out, err = await listed.communicate()
        assert listed.returncode == 0, err.decode()
        (shown,) = json.loads(out)
        assert shown["taints"] == sorted([*DYNAMO_ACCEPTS, TOPOLOGY])
        assert shown["caller_taints"] == sorted(DYNAMO_ACCEPTS)
        assert shown["generated_taints"] == [TOPOLOGY]


async def test_the_route_takes_post_only_and_the_reserved_message_is_dynamos(
    shared_store: Store, shared_store_url: str, http: aiohttp.ClientSession
) -> None:
    async with running(worker(shared_store_url, "--taint", "keep")) as proc:
        before = await stored(shared_store, proc)
        url = proc.field("system") + "/engine/update/model_taints"
        for method in ("GET", "PUT"):
            async with http.request(method, url, json={"taints": ["x"]}) as answer:
                assert answer.status == 405
        status, reply = await post_taints(http, proc, {"taints": ["dynamo.topology/zone=x"]})
        assert (status, reply) == (
            400,
            {
                "error": "Bad request",
                "message": "taint 'dynamo.topology/zone=x' uses reserved prefix 'dynamo.topology/'",
            },
        )
        assert await stored(shared_store, proc) == before


TOKENS = """
[[token]]
name = "ops"
secret = "ops-secret-1"
role = "write"

[[token]]
name = "viewer"
secret = "viewer-secret-1"
role = "read"

[[token]]
name = "autoscaler"
secret = "scaler-secret-1"
role = "write"
prefixes = ["capacity/"]
"""


def audit_lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_every_route_change_leaves_one_audit_line_with_peer_and_token(
    shared_store: Store, shared_store_url: str, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    tokens, audit = tmp_path / "tokens.toml", tmp_path / "audit.log"
    tokens.write_text(TOKENS)
    args = ("--topology", "zone=a", "--token-file", str(tokens), "--audit-log", str(audit))
    async with running(worker(shared_store_url, *args)) as proc:
        before = await stored(shared_store, proc)
        assert (await post_taints(http, proc, {"taints": ["a"]}))[0] == 401
        assert (await post_taints(http, proc, {"taints": ["a"]}, token="viewer-secret-1"))[0] == 403
        status, reply = await post_taints(
            http, proc, {"taints": ["pool=x"]}, token="scaler-secret-1"
        )
        assert (status, reply["error"]) == (403, "Forbidden")
        assert "'pool=x' is outside them" in str(reply["message"])
        assert await stored(shared_store, proc) == before
        status, _ = await post_taints(
            http, proc, {"taints": ["capacity/fast"]}, token="ops-secret-1"
        )
        assert status == 200
        status, _ = await post_taints(
            http, proc, {"taints": ["capacity/fast"]}, token="scaler-secret-1"
        )
        assert status == 200
        assert await proc.stop() == 0
    lines = audit_lines(audit)
    assert [(x["caller"], x["outcome"]) for x in lines] == [
        (None, "UnauthenticatedError"),
        ("viewer", "PermissionDeniedError"),
        ("autoscaler", "PermissionDeniedError"),
        ("ops", "ok"),
        ("autoscaler", "unchanged"),
    ]
    for line in lines:
        host, _, port = str(line["peer"]).rpartition(":")
        assert (line["source"], host, port.isdigit()) == ("worker-route", "127.0.0.1", True)
    done = lines[3]
    assert (done["worker"], done["action"], done["taints"]) == (
        proc.field("id"), "replace", ["capacity/fast"]
    )  # fmt: skip
    assert (done["before"], done["after"]) == ([TOPOLOGY], ["capacity/fast", TOPOLOGY])
    assert isinstance(done["revision"], int) and done["revision"] > 0


async def test_a_plain_token_file_names_its_holder_after_the_file(
    shared_store_url: str, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    token, audit = tmp_path / "worker.token", tmp_path / "audit.log"
    token.write_text("s3cret\n")
    args = ("--token-file", str(token), "--audit-log", str(audit))
    async with running(worker(shared_store_url, *args)) as proc:
        assert (await post_taints(http, proc, {"taints": ["a"]}, token="s3cret"))[0] == 200
        assert await proc.stop() == 0
    (line,) = audit_lines(audit)
    assert (line["caller"], line["outcome"], line["after"]) == ("worker.token", "ok", ["a"])


IN_WORKER = """
import asyncio, json, os, signal, sys
from pathlib import Path
from dynamod.errors import TaintError
from dynamod.worker.runtime import WorkerSettings, run_worker, update_model_taints

async def main():
    settings = WorkerSettings(store=sys.argv[1], model="llama", topology={"zone": "a"},
                              taints=("capacity/fast",), audit_log=Path(sys.argv[2]))
    life = asyncio.create_task(run_worker(settings))
    await asyncio.sleep(0)  # run_worker has started: its writer exists
    after = await update_model_taints({"capacity/slow", "pool=b"})  # waits for registration
    try:
        await update_model_taints(["dynamo.topology/zone=b"])
    except TaintError as exc:
        refused = str(exc)
    print(json.dumps({"after": after, "refused": refused}), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    return await life

sys.exit(asyncio.run(main()))
"""


async def test_code_inside_a_worker_updates_its_taints_like_dynamos_update_model_taints(
    shared_store: Store, shared_store_url: str, tmp_path: Path
) -> None:
    script, audit = tmp_path / "in_worker.py", tmp_path / "audit.log"
    script.write_text(IN_WORKER)
    proc = Proc([sys.executable, str(script), shared_store_url, str(audit)], r"^\{")
    async with running(proc):
        result = json.loads(proc.ready_line)
        assert await proc.wait() == 0
    assert result["after"] == ["capacity/slow", TOPOLOGY, "pool=b"]
    assert result["refused"] == (
        "taint 'dynamo.topology/zone=b' uses reserved prefix 'dynamo.topology/'"
    )
    (line,) = audit_lines(audit)
    assert (line["source"], line["peer"], line["caller"], line["outcome"]) == (
        "worker", "in-process", None, "ok"
    )  # fmt: skip
    assert line["before"] == ["capacity/fast", TOPOLOGY]
    entries, _ = await shared_store.list("v1/workers")
    assert not entries  # deregistered on the way out
