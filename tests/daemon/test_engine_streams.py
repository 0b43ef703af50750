"""Engine state and tokenizers from real worker processes to the daemon's parts, and the
``--engine openai`` worker in front of a real OpenAI-compatible server (a mocker worker's
own inference port: a server without metrics or a health route).

The daemon's pieces run in this process as the daemon wires them (view → router, feeds →
router.report, tokenizer registry); the workers are real ``dynamo-worker`` processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest

from dynamod.boundary import EngineStreams, TokenizerRegistry
from dynamod.discovery.view import WorkerView
from dynamod.engine_events import EngineLoad
from dynamod.load import Busy
from dynamod.records import ModelCard
from dynamod.router import Router, RouteRequest, RouterKnobs
from dynamod.store import open_store
from dynamod.tasks import cancel_and_wait
from dynamod.tokenizers import SimpleTokenizer
from dynamod.tokenizers.bundle import TokenizerRef, published
from tests.support.processes import BIN, Proc, running, worker
from tests.support.servers import free_port

pytestmark = pytest.mark.timeout(90)


class Reports:
    """What the feeds reported, with a way to wait for a report that satisfies a check."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.changed = asyncio.Condition()

    def report(self, key: str, load: EngineLoad | None) -> None:
        self.router.report(key, load)
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def until(
        self, key: str, check: Callable[[EngineLoad | None], bool]
    ) -> EngineLoad | None:
        async with asyncio.timeout(20), self.changed:
            await self.changed.wait_for(lambda: check(self.router.reported(key)))
        return self.router.reported(key)


@contextlib.asynccontextmanager
async def daemon_parts(store_url: str) -> AsyncIterator[tuple[WorkerView, Reports, EngineStreams]]:
    store = await open_store(store_url)
    router = Router(RouterKnobs())
    view = WorkerView(store)
    view.listen(router.apply)
    reports = Reports(router)
    feeds = EngineStreams(view, reports.report)
    try:
        async with asyncio.TaskGroup() as group:
            watcher = group.create_task(view.run())
            follower = group.create_task(feeds.run())
            yield view, reports, feeds
            for task in (follower, watcher):
                await cancel_and_wait(task)
    finally:
        await store.aclose()


async def test_feeds_follow_a_worker_from_registration_to_exit(tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    async with (
        daemon_parts(url) as (view, reports, feeds),
        running(worker(url, "--speedup-ratio", "1", "--max-num-seqs", "1")) as proc,
    ):
        key = proc.field("key")
        snapshot = await reports.until(key, lambda s: s is not None)
        assert snapshot == EngineLoad(kv_blocks_total=16384, source="engine")
        assert len(feeds) == 1 and key in feeds.connected
        body = {"model": "llama", "prompt": "a b c", "max_tokens": 200}
        async with aiohttp.ClientSession() as http:
            requests = [
                asyncio.ensure_future(http.post(f"{proc.field('http')}/v1/completions", json=body))
                for _ in range(2)
            ]
            busy = await reports.until(key, lambda s: s is not None and s.waiting == 1)
            assert busy is not None and busy.running == 1 and busy.kv_blocks_used > 0
            for request in requests:
                (await request).close()
        assert await proc.stop() == 0
        assert await reports.until(key, lambda s: s is None) is None
        await view.wait_for(lambda v: v.get(key) is None)
        assert len(feeds) == 0


async def test_the_registry_fetches_each_models_tokenizer_once(tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    async with daemon_parts(url) as (view, _, _), running(worker(url)) as proc:
        key = proc.field("key")
        await view.wait_for(lambda v: v.get(key) is not None)
        record = view.get(key)
        assert record is not None
        ref = TokenizerRef.of(record.model_card)
        assert ref == TokenizerRef("simple", SimpleTokenizer().checksum)
        async with TokenizerRegistry(view) as registry:
            fetched = await asyncio.gather(
                *(registry.for_card(record.model_card) for _ in range(3))
            )
            assert all(isinstance(t, SimpleTokenizer) for t in fetched)
            assert registry.cached(ref.checksum) is fetched[0]
            # A card naming a tokenizer no worker serves: the approximate one, at once.
            stranger = ModelCard(
                "llama", extra={"tokenizer": {**ref.to_json(), "checksum": "sha256:1"}}
            )
            assert isinstance(await registry.for_card(stranger), SimpleTokenizer)
            assert registry.cached("sha256:1") is None
        system = proc.field("system")
        async with aiohttp.ClientSession() as http, http.get(f"{system}/engine/tokenizer") as got:
            assert await got.read() == published(SimpleTokenizer())


def sidecar(store_url: str, upstream: str, *args: str) -> Proc:
    argv = [
        str(BIN / "dynamo-worker"), "--engine", "openai", "--model", "llama",
        "--upstream", upstream, "--store", store_url, "--lease-ttl", "2",
        "--scrape-interval", "0.1", *args,
    ]  # fmt: skip
    return Proc(argv, r"^dynamo-worker ready:")


async def events(http: aiohttp.ClientSession, system: str) -> dict[str, object]:
    """The first event (the snapshot) of a worker's engine events stream."""
    async with http.get(f"{system}/engine/events") as response:
        first = await response.content.readline()
    event: dict[str, object] = json.loads(first)
    return event


async def test_openai_engine_fronts_an_upstream_drains_and_notices_it_die(tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    upstream = worker((tmp_path / "other").as_uri(), "--speedup-ratio", "20")
    async with running(upstream), running(sidecar(url, upstream.field("http"))) as proc:
        address, system = proc.field("http"), proc.field("system")
        async with aiohttp.ClientSession() as http:
            body = {"model": "llama", "prompt": "hello", "max_tokens": 3, "nvext": {"x": 1}}
            async with http.post(f"{address}/v1/completions", json=body) as response:
                assert response.status == 200
                assert response.headers["x-dynamo-worker-id"] == proc.field("id")
                assert (await response.json())["usage"]["completion_tokens"] == 3
            snapshot = await events(http, system)
            assert snapshot["type"] == "snapshot"
            assert snapshot["state"] == {**EngineLoad(source="proxy").to_json()}
            stream = {"model": "llama", "prompt": "hello", "max_tokens": 60, "stream": True}
            async with http.post(f"{address}/v1/completions", json=stream) as response:
                first = await response.content.readline()
                assert first.startswith(b"data: ")
                proc.send(signal.SIGTERM)  # mid-stream: deregister, drain, then exit
                rest = await response.read()
            assert rest.rstrip().endswith(b"data: [DONE]") and b'"finish_reason":"length"' in rest
            assert await proc.wait() == 0
        proc.assert_clean_stderr()


async def test_an_upstream_that_stops_answering_leaves_the_routable_set_and_comes_back(
    tmp_path: Path,
) -> None:
    url = (tmp_path / "store").as_uri()
    port = free_port()  # the upstream comes back on the same address
    other = (tmp_path / "other").as_uri()
    upstream = worker(other, "--port", str(port))
    async with (
        daemon_parts(url) as (_, reports, _),
        running(upstream),
        running(sidecar(url, upstream.field("http"))) as proc,
    ):
        key = proc.field("key")
        healthy = await reports.until(key, lambda s: s is not None)
        assert healthy is not None and healthy.healthy and healthy.source == "proxy"
        await upstream.stop(signal.SIGKILL)
        sick = await reports.until(key, lambda s: s is not None and not s.healthy)
        assert sick is not None and "is not answering" in sick.reason
        (row,) = reports.router.explain(RouteRequest("llama")).workers
        assert row.busy is Busy.UNHEALTHY
        async with running(worker(other, "--port", str(port))):
            back = await reports.until(key, lambda s: s is not None and s.healthy)
            assert back is not None and back.reason == ""
            (row,) = reports.router.explain(RouteRequest("llama")).workers
            assert row.busy is None
