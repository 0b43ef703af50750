"""The front and the ``--engine openai`` worker outlive hostile workers and upstreams, with
real processes: a real ``dynamod``, honest mocker ``dynamo-worker``s, and the hostile
workers and upstream servers of ``front_fakes.py``.

* One worker's card decides nothing for the others: a worker with ``context_length: 2``
  (registered first, so the lowest id) only loses the requests it cannot hold; a worker
  that reads bodies otherwise (another block size) is left out of routing and reported.
* An answer over the front's limits (a whole body, one SSE event) is a 502 naming the
  worker, the worker is reported, and the daemon's memory stays bounded.
* The ``--engine openai`` worker in front of a hostile upstream: a huge answer is a 502
  and its memory stays bounded; ``max_model_len: true`` and a list-shaped ``/v1/models``
  end its start with one line (exit 1) and nothing registered; a ``/metrics`` page with
  ``NaN`` or odd labels leaves it up, unhealthy with the reason, one log line per problem,
  its record untouched; half an event is never glued to the error event; at the end of
  its grace a stream ends with ``shutting_down`` and ``[DONE]``.
* A body of exactly ``MAX_BODY`` bytes is taken by the front and by the worker alike.
"""

from __future__ import annotations

import asyncio
import io
import json
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from dynamod.http.limits import MAX_BODY
from dynamod.store import open_store
from dynamod.taints import CORDONED
from tests.support.processes import BIN, Proc, daemon_argv, env, running, worker

pytestmark = pytest.mark.timeout(180)

MODEL = "llama"
MIB = 1024 * 1024
TINY = "0" * 16  # the lowest id: the first worker of its model after a restart
ODD = "1" * 16
FAKES = [sys.executable, "-m", "tests.hostile_workers.front_fakes"]
LATE = ("--mode", "huge-later-event", "--taint", "late")


def fake_worker(store: str, *args: str) -> Proc:
    return Proc([*FAKES, "worker", "--store", store, *args], r"^front-fake worker ready:")


def fake_upstream(*args: str) -> Proc:
    return Proc([*FAKES, "upstream", *args], r"^front-fake upstream ready:")


def front(store: str, where: Path, workers: int, **extra: str) -> Proc:
    """A real ``dynamod``, ready once it sees ``workers`` workers."""
    argv = daemon_argv(store, where / "d.sock")
    return Proc(argv, rf"^dynamod ready:.* workers={workers} ", extra)


def sidecar(store: str, upstream: str, *args: str) -> list[str]:
    return [
        str(BIN / "dynamo-worker"), "--engine", "openai", "--model", MODEL,
        "--upstream", upstream, "--store", store, "--lease-ttl", "2",
        "--scrape-interval", "0.1", *args,
    ]  # fmt: skip


def peak_rss(pid: int) -> int:
    """The most memory the process has held so far (``VmHWM``), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


@asynccontextmanager
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        yield http


async def post(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any] | bytes
) -> tuple[int, dict[str, Any], str | None]:
    """Status, JSON body and worker id of a whole answer."""
    # A large body as a stream: aiohttp warns about writing megabytes of bytes at once.
    data = io.BytesIO(body if isinstance(body, bytes) else json.dumps(body).encode())
    headers = {"Content-Type": "application/json"}
    async with http.post(f"{url}/v1/completions", data=data, headers=headers) as reply:
        return reply.status, await reply.json(), reply.headers.get("x-dynamo-worker-id")


async def stream(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[int, list[bytes], str | None]:
    """Status, events (each without its blank line; a JSON answer's body instead) and
    worker id of a streamed answer."""
    async with http.post(f"{url}/v1/completions", json={**body, "stream": True}) as reply:
        raw = await reply.read()
        events = raw.split(b"\n\n")[:-1] if reply.content_type == "text/event-stream" else [raw]
        return reply.status, events, reply.headers.get("x-dynamo-worker-id")


def requiring(*taints: str) -> dict[str, Any]:
    return {"nvext": {"routing_constraints": {"required_taints": list(taints)}}}


async def metric(http: aiohttp.ClientSession, daemon: Proc, line: str) -> bool:
    async with http.get(f"{daemon.field('http')}/metrics") as reply:
        return line in (await reply.text()).splitlines()


# -- one card decides nothing for the others


async def test_a_worker_with_a_tiny_context_only_loses_the_requests_it_cannot_hold(
    tmp_path: Path,
) -> None:
    """Before: the front checked every body against the model's first worker's card, so
    the context-2 worker (the lowest id) had every honest request refused with 400."""
    store = (tmp_path / "store").as_uri()
    body = {"model": MODEL, "prompt": "hello world", "max_tokens": 4}
    async with (
        running(fake_worker(store, "--id", TINY, "--context", "2", "--taint", "tiny")) as tiny,
        running(fake_worker(store, "--id", ODD, "--block-size", "1", "--context", "9000")) as odd,
        running(worker(store, "--taint", "zone=a")) as zoned,
        running(worker(store)) as plain,
        running(front(store, tmp_path, workers=4)) as daemon,
        client() as http,
    ):
        url, honest = daemon.field("http"), {zoned.field("id"), plain.field("id")}
        answered = [await post(http, url, body) for _ in range(12)]
        assert {status for status, _, _ in answered} == {200}
        assert {worker_id for _, _, worker_id in answered} <= honest
        # Taints only honest workers hold: still served.
        status, _, worker_id = await post(http, url, {**body, **requiring("zone=a")})
        assert (status, worker_id) == (200, zoned.field("id"))
        # Fits no worker of the model's reading: 400 naming the largest context there is
        # (the disagreeing worker's 9000 does not count: it decides nothing).
        status, error, worker_id = await post(
            http, url, {"model": MODEL, "prompt": [7] * 8190, "max_tokens": 4}
        )
        assert (status, worker_id) == (400, None)
        assert "context length of 8192 tokens" in error["error"]["message"]
        # Fits the honest workers but not the only one holding the taint: 503, saying why.
        status, error, _ = await post(http, url, {**body, **requiring("tiny")})
        assert status == 503 and error["error"]["code"] == "no_eligible_worker"
        assert f"{TINY} has a context of 2 tokens (the request needs 6)" in str(error)
        # What the tiny worker can hold still reaches it: its own card, its own requests.
        small = {"model": MODEL, "prompt": [5], "max_tokens": 1, **requiring("tiny")}
        assert (await post(http, url, small))[::2] == (200, tiny.field("id"))
        async with http.get(f"{url}/v1/models") as reply:
            assert (await reply.json())["data"][0]["max_model_len"] == 8192
        # The worker that disagrees is reported: one log line, and the gauge.
        assert odd.field("id") not in {w for _, _, w in answered}
        await daemon.logged("1 worker of model 'llama' disagrees with the ")
        assert f"left out of routing: {ODD} (tokenizer sha256:" in daemon.stderr
        gauge = 'dynamod_router_disagreeing_workers{model="llama"} 1.0'
        assert await metric(http, daemon, gauge)


# -- answers over the front's limits


async def test_a_worker_answering_too_much_gets_a_502_naming_it_and_the_daemon_stays_small(
    tmp_path: Path,
) -> None:
    """Before: the front read a worker's answer whole, whatever its size (a 1.5 GB answer
    took the daemon to 5.3 GB). The bound: with a 4 MiB answer limit and a 1 MiB event
    limit, 256 MiB answers leave the daemon's peak memory less than 64 MiB higher."""
    store = (tmp_path / "store").as_uri()
    limits = {"DYNAMO_MAX_ANSWER_MB": "4", "DYNAMO_MAX_EVENT_MB": "1"}
    body = {"model": MODEL, "prompt": "hello world", "max_tokens": 2}
    async with (
        running(fake_worker(store, "--id", "b" * 16, "--mode", "huge", "--taint", "big")) as big,
        running(fake_worker(store, "--id", "c" * 16, *LATE, "--taint", CORDONED)) as late,
        running(worker(store, "--taint", "honest")) as honest,
        running(front(store, tmp_path, workers=3, **limits)) as daemon,
        client() as http,
    ):
        url = daemon.field("http")
        # Warm: the tokenizer is fetched. (The cordoned worker takes only what requires it.)
        assert (await post(http, url, {**body, **requiring("honest")}))[0] == 200
        before = peak_rss(daemon.pid)
        status, error, worker_id = await post(http, url, {**body, **requiring("big")})
        assert (status, worker_id) == (502, big.field("id")), error
        assert error["error"]["code"] == "worker_failed"
        assert f"worker {big.field('id')} sent too large an answer" in error["error"]["message"]
        status, events, worker_id = await stream(http, url, {**body, **requiring("big")})
        assert (status, worker_id) == (502, big.field("id"))
        assert b"sent too large an event" in events[0]
        # Preferred, not required: the front tries it, then another worker.
        prefer = {"nvext": {"routing_constraints": {"preferred_taints": {"big": 1.0}}}}
        status, _, worker_id = await post(http, url, {**body, **prefer})
        assert (status, worker_id) == (200, honest.field("id"))
        # Past its first event the stream is the client's: it ends with an error event.
        status, events, worker_id = await stream(http, url, {**body, **requiring("late", CORDONED)})
        assert (status, worker_id) == (200, late.field("id"))
        assert events[0].startswith(b'data: {"id":"x"') and events[-1] == b"data: [DONE]"
        error_event = json.loads(events[1].removeprefix(b"data: "))["error"]
        assert f"worker {late.field('id')} sent too large an event" in error_event["message"]
        assert peak_rss(daemon.pid) - before < 64 * MIB
        assert await metric(
            http, daemon, 'dynamod_front_worker_failures_total{reason="oversize"} 4.0'
        )
        assert daemon.stderr.count(f"worker {big.field('id')} sent too large an") == 3


# -- the --engine openai worker in front of a hostile upstream


async def test_the_sidecar_answers_502_to_a_huge_upstream_answer_and_stays_small(
    tmp_path: Path,
) -> None:
    """Before: the sidecar read the upstream's answer whole (3.7 GB for a huge one). The
    bound: its 64 MiB answer limit and 16 MiB event limit; 256 MiB answers leave its peak
    memory less than 128 MiB higher."""
    store = (tmp_path / "store").as_uri()
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
    async with (
        running(fake_upstream("--mode", "huge", "--size-mb", "256")) as upstream,
        running(Proc(sidecar(store, upstream.field("url")), r"^dynamo-worker ready:")) as proc,
        client() as http,
    ):
        address = proc.field("http")
        before = peak_rss(proc.pid)
        status, error, worker_id = await post(http, address, body)
        assert (status, worker_id) == (502, proc.field("id"))
        said = error["error"]["message"]
        assert said.startswith(f"upstream {upstream.field('url')}/v1/completions sent too large")
        status, events, _ = await stream(http, address, body)
        assert status == 502 and b"sent too large an event" in events[0]
        assert peak_rss(proc.pid) - before < 128 * MIB
        assert proc.proc is not None and proc.proc.returncode is None
    proc.assert_clean_stderr()


async def start_refused(argv: list[str]) -> tuple[int, str]:
    """Run a worker expected to refuse to start; its exit code and stderr."""
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env()
    )
    try:
        async with asyncio.timeout(60):
            _, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, err.decode()


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("bool-context", "says max_model_len true for model 'llama'; it must be an integer"),
        ("list-models", "not a JSON object with a 'data' list of models"),
    ],
)
async def test_a_sidecar_refuses_an_upstream_whose_models_it_cannot_read(
    tmp_path: Path, mode: str, said: str
) -> None:
    """Before: ``max_model_len: true`` made the sidecar register a record its own reader
    refuses and rewrite it ~2,500 times a second; a list-shaped answer was a traceback.
    Now: one line, exit 1, and nothing written to the store."""
    store = (tmp_path / "store").as_uri()
    async with running(fake_upstream("--mode", mode)) as upstream:
        code, err = await start_refused(sidecar(store, upstream.field("url")))
    assert code == 1 and said in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if said in line]) == 1
    async with await open_store(store) as opened:
        assert await opened.list("v1/workers") == ([], 0)


async def healthy_is(http: aiohttp.ClientSession, system: str, wanted: bool) -> dict[str, Any]:
    """The worker's engine state once its health is ``wanted``, followed on its engine
    events stream (a snapshot, then a state at each change)."""
    async with asyncio.timeout(20), http.get(f"{system}/engine/events") as response:
        async for line in response.content:
            state = json.loads(line).get("state")
            if state is not None and state["healthy"] is wanted:
                found: dict[str, Any] = state
                return found
    raise AssertionError(f"the events stream of {system} ended")


async def test_a_metrics_page_the_sidecar_refuses_marks_it_unhealthy_and_nothing_more(
    tmp_path: Path,
) -> None:
    """Before: a ``NaN`` killed the scrape task without a word, and the worker stayed
    "healthy" whatever became of its upstream."""
    store = (tmp_path / "store").as_uri()
    pages = {
        "NaN": "vllm:num_requests_running NaN\nvllm:num_requests_waiting 0\n",
        "odd labels": 'vllm:num_requests_running{a="x",a="y"} 1\nvllm:num_requests_waiting 0\n',
    }
    async with (
        running(fake_upstream()) as upstream,
        running(Proc(sidecar(store, upstream.field("url")), r"^dynamo-worker ready:")) as proc,
        await open_store(store) as opened,
        client() as http,
    ):
        system, key, control = proc.field("system"), proc.field("key"), upstream.field("url")
        assert (await healthy_is(http, system, True))["reason"] == ""
        registered = await opened.get(key)
        assert registered is not None
        for n, (what, page) in enumerate(pages.items(), 1):
            async with http.post(f"{control}/control/metrics", data=page) as reply:
                assert reply.status == 200
            state = await healthy_is(http, system, False)
            assert "sent metrics the worker refuses" in state["reason"], what
            await asyncio.sleep(1.0)  # ten scrapes of the same page
            assert proc.stderr.count("sent metrics the worker refuses") == n, what
            assert (await post(http, proc.field("http"), {"model": MODEL, "prompt": "hi"}))[0]
            async with http.post(f"{control}/control/metrics", data="") as reply:
                assert reply.status == 200
            await healthy_is(http, system, True)
        assert proc.proc is not None and proc.proc.returncode is None
        now = await opened.get(key)
        assert now is not None and now.revision == registered.revision
    proc.assert_clean_stderr()


async def test_half_an_upstream_event_is_never_glued_to_the_error_event(tmp_path: Path) -> None:
    """Before: the sidecar passed the upstream's bytes on as they came, so an upstream that
    dropped its connection mid-event had half a JSON object glued to the error event."""
    store = (tmp_path / "store").as_uri()
    async with (
        running(fake_upstream("--mode", "half-event")) as upstream,
        running(Proc(sidecar(store, upstream.field("url")), r"^dynamo-worker ready:")) as proc,
        client() as http,
    ):
        status, events, _ = await stream(http, proc.field("http"), {"model": MODEL, "prompt": "x"})
    assert status == 200 and len(events) == 3 and events[-1] == b"data: [DONE]"
    first, error = (json.loads(e.removeprefix(b"data: ")) for e in events[:2])
    assert first["id"] == "x"
    assert error["error"]["code"] == "upstream_failed"
    assert "failed mid-stream" in error["error"]["message"]


async def test_the_sidecar_ends_its_streams_with_shutting_down_at_the_end_of_its_grace(
    tmp_path: Path,
) -> None:
    """Before: at the end of its grace the sidecar cut its streams without a word."""
    store = (tmp_path / "store").as_uri()
    async with (
        running(fake_upstream("--mode", "slow-stream")) as upstream,
        running(
            Proc(sidecar(store, upstream.field("url"), "--grace", "1"), r"^dynamo-worker ready:")
        ) as proc,
        client() as http,
    ):
        body = {"model": MODEL, "prompt": "x", "stream": True}
        async with http.post(f"{proc.field('http')}/v1/completions", json=body) as reply:
            assert (await reply.content.readline()).startswith(b"data: ")
            proc.send(signal.SIGTERM)
            rest = await reply.read()
        events = rest.split(b"\n\n")
        assert events[-3:] == [events[-3], b"data: [DONE]", b""]
        error = json.loads(events[-3].removeprefix(b"data: "))["error"]
        assert error["code"] == "shutting_down"
        assert "grace period of 1 s ended" in error["message"]
        assert await proc.wait() == 70


# -- one number for the largest body


async def test_a_body_of_exactly_max_body_bytes_is_taken_by_the_front_and_the_worker(
    tmp_path: Path,
) -> None:
    """Before: the front added the prompt's token ids to a body it took, and the worker
    refused the grown body: 413 through the front, 200 straight to the worker."""
    store = (tmp_path / "store").as_uri()

    def padded(size: int) -> bytes:
        head = b'{"model":"llama","prompt":"hello there","max_tokens":2,"user":"'
        return head + b"u" * (size - len(head) - 2) + b'"}'

    async with (
        running(worker(store)) as honest,
        running(front(store, tmp_path, workers=1)) as daemon,
        client() as http,
    ):
        for size, wanted in ((MAX_BODY, 200), (MAX_BODY + 1, 413)):
            raw = padded(size)
            assert len(raw) == size
            at_front = (await post(http, daemon.field("http"), raw))[0]
            at_worker = (await post(http, honest.field("http"), raw))[0]
            assert (at_front, at_worker) == (wanted, wanted), size
