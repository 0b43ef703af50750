"""dynamo-worker as a real process: the taint route on every shared store, and shutdown."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest

from dynamod.discovery.view import WorkerView
from dynamod.discovery_events import WorkerModified, WorkerRemoved
from dynamod.records import WorkerRecord
from dynamod.store import Store
from tests.support.processes import Proc, running, worker

pytestmark = pytest.mark.timeout(120)

RESERVED = "taint 'dynamo.topology/zone=a' uses reserved prefix 'dynamo.topology/'"  # Dynamo's


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def post_taints(
    http: aiohttp.ClientSession,
    proc: Proc,
    body: object = None,
    *,
    raw: bytes | None = None,
    token: str | None = None,
) -> tuple[int, dict[str, object]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = proc.field("system") + "/engine/update/model_taints"
    data = raw if raw is not None else None
    async with http.post(
        url, json=None if raw is not None else body, data=data, headers=headers
    ) as response:
        return response.status, await response.json()


async def stored(store: Store, proc: Proc) -> bytes:
    entry = await store.get(proc.field("key"))
    assert entry is not None
    return entry.value


async def test_taint_route_updates_the_record_that_other_processes_see(
    shared_store: Store, shared_store_url: str, http: aiohttp.ClientSession
) -> None:
    view = WorkerView(shared_store)
    async with (
        asyncio.TaskGroup() as group,
        running(
            worker(shared_store_url, "--taint", "capacity/fast", "--topology", "zone=a")
        ) as proc,
    ):
        viewer = group.create_task(view.run())
        key = proc.field("key")
        await view.wait_for(lambda v: v.get(key) is not None)
        with view.subscribe(since=view.revision) as events:
            status, body = await post_taints(
                http, proc, {"taints": ["pool=b", "capacity/slow", "pool=b"]}
            )
            assert (status, body) == (200, {"status": "ok", "taints": ["capacity/slow", "pool=b"]})
            async with asyncio.timeout(10):
                event = await anext(events)
        assert isinstance(event, WorkerModified)
        assert event.taints == ("capacity/slow", "dynamo.topology/zone=a", "pool=b")
        assert event.added == ("capacity/slow", "pool=b")
        assert event.removed == ("capacity/fast",)

        status, body = await post_taints(http, proc, {"taints": []})
        assert (status, body) == (200, {"status": "ok", "taints": []})
        record = WorkerRecord.from_bytes(await stored(shared_store, proc))
        assert record.taints == ("dynamo.topology/zone=a",)
        async with http.get(proc.field("system") + "/metadata") as response:
            metadata = await response.json()
        assert metadata["record"]["runtime_config"]["taints"] == ["dynamo.topology/zone=a"]
        viewer.cancel()


@pytest.mark.parametrize(
    ("body", "raw", "message"),
    [
        (None, b"{not json", "request body is not valid JSON: "),
        (["capacity/fast"], None, "request body must be a JSON object"),
        ({}, None, "'taints' must be a JSON array of strings"),
        ({"taints": "capacity/fast"}, None, "'taints' must be a JSON array of strings"),
        ({"taints": ["ok", 3]}, None, "'taints' must be a JSON array of strings"),
        ({"taints": ["dynamo.topology/zone=a"]}, None, RESERVED),
        (
            {"taints": ["ok", "DYNAMO.TOPOLOGY/zone=a"]},
            None,
            "taint 'DYNAMO.TOPOLOGY/zone=a' looks like reserved prefix 'dynamo.topology/'",
        ),
        ({"taints": ["ok", ""]}, None, "taint '' is empty"),
        ({"taints": ["tab\tinside"]}, None, "taint 'tab\\tinside' has control or invisible"),
        ({"taints": ["x" * 1025]}, None, "taint 'xxx"),
    ],
)
async def test_bad_bodies_get_400_and_leave_the_record_alone(
    shared_store: Store,
    shared_store_url: str,
    http: aiohttp.ClientSession,
    body: object,
    raw: bytes | None,
    message: str,
) -> None:
    async with running(worker(shared_store_url, "--taint", "keep", "--topology", "zone=a")) as proc:
        before = await stored(shared_store, proc)
        status, reply = await post_taints(http, proc, body, raw=raw)
        assert status == 400
        assert reply["error"] == "Bad request"
        assert str(reply["message"]).startswith(message)
        assert await stored(shared_store, proc) == before


async def test_token_oversize_and_metrics(
    shared_store: Store, shared_store_url: str, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    async with running(worker(shared_store_url, "--token-file", str(token_file))) as proc:
        before = await stored(shared_store, proc)
        status, reply = await post_taints(http, proc, {"taints": ["a"]})
        assert (status, reply["message"]) == (401, "a bearer token is required")
        status, reply = await post_taints(http, proc, {"taints": ["a"]}, token="wrong")
        assert (status, reply["message"]) == (401, "the bearer token is not valid")
        status, reply = await post_taints(http, proc, {"taints": ["x" * 60] * 2000}, token="s3cret")
        assert status == 413
        assert reply["message"] == "the request body is over the limit of 65536 bytes"
        assert await stored(shared_store, proc) == before
        status, reply = await post_taints(http, proc, {"taints": ["a"]}, token="s3cret")
        assert (status, reply) == (200, {"status": "ok", "taints": ["a"]})
        async with http.get(proc.field("system") + "/metrics") as response:
            text = await response.text()
        assert 'dynamo_worker_taint_updates_total{outcome="ok"} 1.0' in text
        assert 'dynamo_worker_taint_updates_total{outcome="unauthorized"} 2.0' in text
        assert "dynamo_worker_kv_blocks_total" in text


async def test_openai_client_through_a_real_worker_process(shared_store_url: str) -> None:
    async with running(worker(shared_store_url)) as proc:
        client = openai.AsyncOpenAI(base_url=proc.field("http") + "/v1", api_key="none")
        async with client:
            raw = await client.completions.with_raw_response.create(
                model="llama", prompt="hello there world", max_tokens=4
            )
            completion = raw.parse()
            assert raw.headers["x-dynamo-worker-id"] == proc.field("id")
            assert completion.usage is not None
            assert completion.usage.completion_tokens == 4
            stream = await client.chat.completions.create(
                model="llama",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=3,
                stream=True,
            )
            chunks = [chunk async for chunk in stream]
            assert chunks[-1].choices[0].finish_reason == "length"
        assert await proc.stop() == 0
        proc.assert_clean_stderr()


# --- shutdown ---


async def stream_tokens(http: aiohttp.ClientSession, proc: Proc, tokens: int) -> tuple[int, str]:
    url = proc.field("http") + "/v1/completions"
    body = {
        "model": "llama",
        "prompt": "tell me a long story",
        "max_tokens": tokens,
        "stream": True,
    }
    async with http.post(url, json=body) as response:
        text = await response.text()
        return response.status, text


async def first_byte(
    http: aiohttp.ClientSession, proc: Proc, tokens: int
) -> aiohttp.ClientResponse:
    url = proc.field("http") + "/v1/completions"
    body = {
        "model": "llama",
        "prompt": "tell me a long story",
        "max_tokens": tokens,
        "stream": True,
    }
    response = await http.post(url, json=body)
    await response.content.readline()
    return response


async def test_sigterm_deregisters_first_then_finishes_the_stream(
    shared_store: Store, shared_store_url: str, http: aiohttp.ClientSession
) -> None:
    view = WorkerView(shared_store)
    order: list[str] = []
    proc = worker(shared_store_url, "--speedup-ratio", "1", "--grace", "30")
    async with asyncio.TaskGroup() as group, running(proc):
        viewer = group.create_task(view.run())
        key = proc.field("key")
        await view.wait_for(lambda v: v.get(key) is not None)
        view.listen(lambda e: order.append("removed") if isinstance(e, WorkerRemoved) else None)
        response = await first_byte(http, proc, 300)
        proc.send(signal.SIGTERM)
        body = await response.text()
        order.append("stream finished")
        response.release()
        assert await proc.wait() == 0
        viewer.cancel()
    assert body.rstrip().endswith("data: [DONE]")
    assert order == ["removed", "stream finished"]
    proc.assert_clean_stderr()


async def test_sigterm_past_the_grace_period_exits_70(
    shared_store_url: str, http: aiohttp.ClientSession
) -> None:
    proc = worker(shared_store_url, "--speedup-ratio", "1", "--grace", "0.5")
    async with running(proc):
        response = await first_byte(http, proc, 4000)
        proc.send(signal.SIGTERM)
        assert await proc.wait() == 70
        response.release()
    assert "shutting down with 1 requests still in flight" in proc.stderr
    proc.assert_clean_stderr()


async def test_a_second_signal_skips_the_grace_period(
    shared_store_url: str, http: aiohttp.ClientSession
) -> None:
    proc = worker(shared_store_url, "--speedup-ratio", "1", "--grace", "60")
    async with running(proc):
        response = await first_byte(http, proc, 4000)
        proc.send(signal.SIGTERM)
        await proc.logged("SIGTERM received")
        proc.send(signal.SIGINT)
        assert await proc.wait(within=10) == 70
        response.release()
    assert "skipping the grace period" in proc.stderr
    proc.assert_clean_stderr()


async def test_idle_worker_exits_0_with_clean_stderr(shared_store_url: str) -> None:
    async with running(worker(shared_store_url)) as proc:
        assert await proc.stop(signal.SIGINT) == 0
    proc.assert_clean_stderr()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--taint", "dynamo.topology/zone=a"], RESERVED),
        (["--topology", "zone"], "--topology 'zone' must look like DOMAIN=VALUE"),
        (
            ["--topology", "zone= a"],
            'topology_domains value for "zone" must not contain leading or trailing whitespace',
        ),
        (
            ["--kv-transfer-enforcement", "required"],
            "kv_transfer_enforcement requires kv_transfer_domain",
        ),
        (["--namespace", "a/b"], "--namespace 'a/b' must not contain '/'"),
        (["--lease-ttl", "0.5"], "--lease-ttl must be at least 1 second, got 0.5"),
    ],
)
async def test_invalid_flags_exit_2_before_registering(
    shared_store: Store, shared_store_url: str, args: list[str], message: str
) -> None:
    proc = worker(shared_store_url, *args)
    with pytest.raises(AssertionError, match="exited 2 before ready"):
        await proc.start()
    assert f"dynamo-worker: error: {message}" in proc.stderr
    assert (await shared_store.list(""))[0] == []


async def test_unreachable_store_is_one_line_and_exit_1(tmp_path: Path) -> None:
    proc = worker("etcd://127.0.0.1:1/x")
    with pytest.raises(AssertionError, match="exited 1 before ready"):
        await proc.start()
    assert "dynamo-worker: " in proc.stderr
    proc.assert_clean_stderr()
