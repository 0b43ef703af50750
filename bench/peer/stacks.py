"""The two stacks the peer benchmark compares, each one front and one mocker worker, on one etcd.

* **dynamod**: ``dynamo-worker --engine mocker`` and ``dynamod`` with its HTTP front, both
  real subprocesses (``tests.support.processes``), on the etcd prefix ``dynamod-peer``.
* **Dynamo 1.6.1**: ``python -m dynamo.frontend --router-mode kv`` and the stock mocker
  with Dynamo's own taint route (``mocker.py``), from the cached venv, with the
  environment Dynamo needs to run offline on loopback (``dynamo_env``). ``kv`` is the one
  1.6.1 router mode that honours ``required_taints``; the others ignore it silently.

Both mockers divide simulated time by 10^6, so engine time is negligible; both use 64-token
KV blocks and 16384 of them (the two defaults, set explicitly), and both log warnings only.
A stack is ready when its front lists the model and a request reaches the worker.

Which worker served a request: dynamod's front and workers say so in the
``x-dynamo-worker-id`` header; Dynamo's frontend says so in the body when asked with
``"nvext": {"extra_fields": ["worker_id"]}`` (``nvext.worker_id.decode_worker_id``, the
worker's etcd lease id). ``Stack.served_by`` reads whichever applies.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from bench.peer.procs import Detached, detached
from dynamod.http.openai import WORKER_ID_HEADER
from tests.support.processes import daemon, running, worker
from tests.support.servers import EtcdServer, free_port

HERE = Path(__file__).resolve().parent
MODEL = "peer-model"
SPEEDUP = "1000000"
BLOCK_SIZE = "64"
KV_BLOCKS = "16384"
READY_WITHIN = 180.0  # s; Dynamo imports transformers and fetches the card on a busy machine
ASK_WORKER = {"extra_fields": ["worker_id"]}  # Dynamo's way to name the worker in the answer
Json = dict[str, Any]
T = TypeVar("T")


@dataclass(frozen=True)
class Stack:
    """One running stack, as the measurements see it."""

    key: str  # "ours" or "dynamo": the JSON's keys
    front: str  # base URL of the OpenAI front
    system: str  # base URL of the worker's system port (the taint route)
    worker_id: str
    front_pid: int
    worker_pid: int
    served_by: Callable[[Mapping[str, str], Json], str | None]
    direct: str | None = None  # base URL of the worker's own OpenAI routes, if it has any


def _from_header(headers: Mapping[str, str], body: Json) -> str | None:
    return headers.get(WORKER_ID_HEADER)


def _from_nvext(headers: Mapping[str, str], body: Json) -> str | None:
    found = ((body.get("nvext") or {}).get("worker_id") or {}).get("decode_worker_id")
    return None if found is None else str(found)


@contextlib.asynccontextmanager
async def ours(etcd: EtcdServer, scratch: Path) -> AsyncIterator[Stack]:
    store = etcd.url("dynamod-peer")
    engine = ("--speedup-ratio", SPEEDUP, "--block-size", BLOCK_SIZE, "--num-kv-blocks", KV_BLOCKS)
    quiet = ("--log-level", "WARNING")
    async with (
        running(worker(store, *engine, *quiet, model=MODEL)) as mocker,
        running(daemon(store, scratch / "dynamod.sock", "--log-level", "warning")) as front,
        aiohttp.ClientSession() as http,
    ):
        front_url = front.field("http")
        await _until(lambda: _serves(http, front_url, {}), "dynamod's front to serve", [])
        yield Stack(
            key="ours",
            front=front_url,
            system=mocker.field("system"),
            worker_id=mocker.field("id"),
            front_pid=front.pid,
            worker_pid=mocker.pid,
            served_by=_from_header,
            direct=mocker.field("http"),
        )
        await front.stop()
        await mocker.stop()


def dynamo_env(etcd: EtcdServer, home: Path) -> dict[str, str]:
    """Offline, loopback-only, quiet: what every Dynamo process gets (and nothing of ours)."""
    home.mkdir(parents=True, exist_ok=True)
    loopback = ("DYN_TCP_RPC_HOST", "DYN_EVENT_PLANE_HOST", "DYN_TCP_RESPONSE_STREAM_HOST",
                "DYN_SYSTEM_HOST")  # fmt: skip
    return {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": str(home),  # the frontend caches model files under $HOME/.cache/dynamo
        "HF_HOME": str(home / "hf"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "ETCD_ENDPOINTS": f"http://{etcd.endpoint}",
        "DYN_DISCOVERY_BACKEND": "etcd",
        "DYN_LOG": "warn",
        "PYTHONUNBUFFERED": "1",
        # Without these, workers publish the host's external address and ZMQ binds 0.0.0.0.
        **dict.fromkeys(loopback, "127.0.0.1"),
    }


def system_port() -> int:
    """A free port for DYN_SYSTEM_PORT, which Dynamo parses as a signed 16-bit number.

    Linux hands out ephemeral ports from 32768 up, so asking the kernel for port 0 never
    gives a usable one: try random ports below 32768 until one binds."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randint(20000, 32767)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port in 20000-32767 for Dynamo's system server")


@contextlib.asynccontextmanager
async def dynamo(
    venv: Path, etcd: EtcdServer, model_dir: Path, scratch: Path
) -> AsyncIterator[Stack]:
    python, env = str(venv / "bin" / "python"), dynamo_env(etcd, scratch / "dynamo-home")
    http_port, sys_port = free_port(), system_port()
    frontend = Detached(
        "Dynamo frontend",
        [python, "-m", "dynamo.frontend", "--http-host", "127.0.0.1",
         "--http-port", str(http_port), "--router-mode", "kv"],
        env, scratch / "dynamo-frontend.log",
    )  # fmt: skip
    mocker = Detached(
        "Dynamo mocker",
        [python, str(HERE / "mocker.py"), "--model-path", str(model_dir),
         "--model-name", MODEL, "--speedup-ratio", SPEEDUP, "--block-size", BLOCK_SIZE,
         "--num-gpu-blocks-override", KV_BLOCKS],
        {**env, "DYN_SYSTEM_PORT": str(sys_port)}, scratch / "dynamo-mocker.log",
    )  # fmt: skip
    front_url = f"http://127.0.0.1:{http_port}"
    async with detached(frontend), detached(mocker), aiohttp.ClientSession() as http:
        procs = [frontend, mocker]
        card = await _until(lambda: _card(http, etcd, sys_port), "the mocker's model card", procs)
        pinned = {"backend_instance_id": card, **ASK_WORKER}
        await _until(lambda: _serves(http, front_url, pinned), "Dynamo's frontend", procs)
        yield Stack(
            key="dynamo",
            front=front_url,
            system=f"http://127.0.0.1:{sys_port}",
            worker_id=str(card),
            front_pid=frontend.pid,
            worker_pid=mocker.pid,
            served_by=_from_nvext,
        )


async def _until(
    probe: Callable[[], Awaitable[T | None]],
    what: str,
    procs: list[Detached],
    within: float = READY_WITHIN,
) -> T:
    """Poll ``probe()`` until it returns something other than None. The processes give no
    readiness signal of their own, so this is the one wait that polls (every 0.1 s)."""
    deadline = time.monotonic() + within
    while (found := await probe()) is None:
        for proc in procs:
            proc.check_alive(f"waiting for {what}")
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.tail()}" for p in procs)
            raise RuntimeError(f"timed out after {within:g} s waiting for {what}\n{tails}")
        await asyncio.sleep(0.1)
    return found


async def _serves(http: aiohttp.ClientSession, front: str, nvext: Json) -> bool | None:
    """True once a one-token completion through ``front`` is answered 200."""
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 1, "nvext": nvext}
    try:
        async with http.post(front + "/v1/completions", json=body) as response:
            await response.read()
            return True if response.status == 200 else None
    except aiohttp.ClientError:
        return None


async def _card(http: aiohttp.ClientSession, etcd: EtcdServer, sys_port: int) -> int | None:
    """The lease id of the worker whose model card points at ``sys_port``, from etcd's JSON
    gateway (the card's file URLs are served on the worker's system port)."""
    key = base64.b64encode(b"v1/mdc/").decode()
    end = base64.b64encode(b"v1/mdc0").decode()  # '0' follows '/': the prefix's range end
    url = f"http://{etcd.endpoint}/v3/kv/range"
    async with http.post(url, json={"key": key, "range_end": end}) as response:
        found = await response.json()
    for kv in found.get("kvs", []):
        card = json.loads(base64.b64decode(kv["value"]))
        if f"127.0.0.1:{sys_port}/" in json.dumps(card.get("card_json", {})):
            instance: int = card["instance_id"]
            return instance
    return None
