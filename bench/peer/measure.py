"""What the peer benchmark measures, one block at a time, against any target.

A *target* answers the same completion: a front, or a worker with nothing in front. HTTP
targets (both fronts, and dynamod's worker) are driven from this process with ``aiohttp``;
Dynamo's worker, which has no HTTP route, through ``direct.py`` in Dynamo's venv
(``Direct``). Every function here runs one block (a few dozen requests, or a few seconds)
so that the caller can alternate blocks between targets; samples are nanoseconds.

* ``sequential``: one request at a time on a kept-alive connection, to the whole answer.
* ``first_event``: streaming, to the first ``data:`` event; on a new connection per request
  (``fresh``) or a kept-alive one. A kept-alive connection is opened by one untimed
  request at the start of the block.
* ``closed_loop``: ``concurrency`` clients, each sending its next request when the last is
  answered, for ``seconds``.
* ``taint_update``: replace the worker's taints through its system port with a value never
  used before; from the POST returning, send requests that require it back to back until
  one is answered 200 (500/503 mean "no worker has it yet"); check which worker served it;
  then time one more such request, now routable at once: the floor of that wait.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import psutil

from bench.peer.procs import Detached
from bench.peer.stacks import ASK_WORKER, MODEL, Stack

NOT_YET = (500, 503)  # Dynamo's and dynamod's answers when no worker has the taint
ROUTED_WITHIN = 10.0  # s an update may take to be routable before the benchmark gives up


@dataclass
class Load:
    """One closed-loop block: request latencies, errors by kind, the block's wall time."""

    ns: list[int] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU used per process, by role


@dataclass(frozen=True)
class TaintSample:
    post_ns: int  # the POST to the system port, sent to answered
    routed_ns: int  # the POST answered to the first 200 for a request requiring the taint
    attempts: int  # requests sent until that 200
    steady_ns: int  # one more such request once routable: the floor of routed_ns


class Target(Protocol):
    name: str

    async def sequential(self, n: int) -> list[int]: ...
    async def first_event(self, n: int, *, fresh: bool) -> list[int]: ...
    async def closed_loop(self, concurrency: int, seconds: float) -> Load: ...


class Http:
    """An OpenAI ``/v1/completions`` URL and the one body it is sent."""

    def __init__(self, name: str, base: str, body: dict[str, Any]) -> None:
        self.name, self.url = name, base + "/v1/completions"
        self.body = json.dumps(body).encode()
        self.stream_body = json.dumps({**body, "stream": True}).encode()
        self.headers = {"content-type": "application/json"}

    async def sequential(self, n: int) -> list[int]:
        async with aiohttp.ClientSession() as http:
            await self._one(http)  # untimed: opens the connection the block keeps
            return [await self._one(http) for _ in range(n)]

    async def _one(self, http: aiohttp.ClientSession) -> int:
        started = time.perf_counter_ns()
        async with http.post(self.url, data=self.body, headers=self.headers) as response:
            await response.read()
        if response.status != 200:
            raise RuntimeError(f"{self.name}: {self.url} answered {response.status}")
        return time.perf_counter_ns() - started

    async def first_event(self, n: int, *, fresh: bool) -> list[int]:
        connector = aiohttp.TCPConnector(force_close=fresh)
        async with aiohttp.ClientSession(connector=connector) as http:
            if not fresh:
                await self._first(http)  # untimed: opens the connection the block keeps
            return [await self._first(http) for _ in range(n)]

    async def _first(self, http: aiohttp.ClientSession) -> int:
        started = time.perf_counter_ns()
        first = 0
        async with http.post(self.url, data=self.stream_body, headers=self.headers) as response:
            async for line in response.content:
                if not first and line.startswith(b"data:"):
                    first = time.perf_counter_ns()
        if response.status != 200 or not first:
            raise RuntimeError(f"{self.name}: stream from {self.url} failed ({response.status})")
        return first - started

    async def closed_loop(self, concurrency: int, seconds: float) -> Load:
        load = Load()
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as http:
            stop_at = time.perf_counter() + seconds
            started = time.perf_counter()
            async with asyncio.TaskGroup() as group:
                for _ in range(concurrency):
                    group.create_task(self._client(http, load, stop_at))
            load.seconds = time.perf_counter() - started
        return load

    async def _client(self, http: aiohttp.ClientSession, load: Load, stop_at: float) -> None:
        while time.perf_counter() < stop_at:
            try:
                load.ns.append(await self._one(http))
            except (RuntimeError, aiohttp.ClientError) as exc:
                kind = type(exc).__name__
                load.errors[kind] = load.errors.get(kind, 0) + 1


class Direct:
    """Dynamo's worker with no front: ``direct.py`` running in Dynamo's venv."""

    def __init__(self, name: str, helper: Detached) -> None:
        self.name, self.helper = name, helper

    async def _ask(self, **command: Any) -> dict[str, Any]:
        answer: dict[str, Any] = json.loads(await self.helper.ask(json.dumps(command)))
        return answer

    async def sequential(self, n: int) -> list[int]:
        found: list[int] = (await self._ask(op="seq", n=n))["ns"]
        return found

    async def first_event(self, n: int, *, fresh: bool) -> list[int]:
        found: list[int] = (await self._ask(op="first", n=n))["ns"]
        return found

    async def closed_loop(self, concurrency: int, seconds: float) -> Load:
        found = await self._ask(op="load", concurrency=concurrency, seconds=seconds)
        errors = {"failed": found["errors"]} if found["errors"] else {}
        return Load(ns=found["ns"], errors=errors, seconds=found["seconds"])


async def taint_update(http: aiohttp.ClientSession, stack: Stack, value: str) -> TaintSample:
    """See the module docstring."""
    started = time.perf_counter_ns()
    route = stack.system + "/engine/update/model_taints"
    async with http.post(route, json={"taints": [value]}) as response:
        said = await response.text()
    posted = time.perf_counter_ns()
    if response.status != 200:
        raise RuntimeError(f"{stack.key}: taint update answered {response.status}: {said}")
    attempts = 0
    while True:
        attempts += 1
        if await _routed(http, stack, value):
            break
        if time.perf_counter_ns() - posted > ROUTED_WITHIN * 1e9:
            raise RuntimeError(f"{stack.key}: taint {value!r} not routable after {ROUTED_WITHIN} s")
    routed = time.perf_counter_ns()
    if not await _routed(http, stack, value):
        raise RuntimeError(f"{stack.key}: taint {value!r} was routable, then was not")
    return TaintSample(posted - started, routed - posted, attempts, time.perf_counter_ns() - routed)


async def _routed(http: aiohttp.ClientSession, stack: Stack, value: str) -> bool:
    """Whether a request requiring ``value`` is served, and by the updated worker."""
    nvext = {"routing_constraints": {"required_taints": [value]}, **ASK_WORKER}
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 1, "nvext": nvext}
    async with http.post(stack.front + "/v1/completions", json=body) as response:
        answer = await response.json(content_type=None)
    if response.status in NOT_YET:
        return False
    served = stack.served_by(response.headers, answer) if response.status == 200 else None
    if served != stack.worker_id:
        raise RuntimeError(
            f"{stack.key}: a request requiring {value!r} got {response.status} from worker "
            f"{served}, expected worker {stack.worker_id}: {answer}"
        )
    return True


def tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def rss_mib(pid: int) -> float:
    return sum(p.memory_info().rss for p in tree(pid)) / 2**20


def peak_rss_mib(pid: int) -> float:
    """VmHWM: the most the process itself ever held (its children not included)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process and its descendants so far."""
    return sum(sum(p.cpu_times()[:2]) for p in tree(pid))
