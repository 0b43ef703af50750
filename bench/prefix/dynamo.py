"""NVIDIA Dynamo 1.6.1 on ``bench/prefix/run.py``'s chat workload (``--dynamo``).

On an etcd of its own and from the peer harness's cached venv (``peer_venv``), with the
environment it needs offline on loopback (``peer_stacks.dynamo_env``): ``workers`` stock
mockers with the cache of ours (``--block-size 16 --num-gpu-blocks-override 64``, the same
``--speedup-ratio`` and ``--max-num-seqs``), and three frontends over those same mockers:

* ``kv``: ``--router-mode kv`` with KV events (its default);
* ``approximate``: ``--router-mode kv --no-router-kv-events`` (it predicts the caches from
  its own routing decisions);
* ``random``: ``--router-mode random``.

The model directory is ``model.py``'s, its tokenizer trained on the workload's own
words, so that a word is a token on both stacks, as near as a trained BPE gets; prompt
token counts are reported per stack, and the hit rate is a ratio of the stack's own counts.
Which worker served a request: asked with ``nvext.extra_fields = ["worker_id"]``.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

from bench.peer import venv as peer_venv
from bench.peer.procs import Detached, detached
from bench.peer.stacks import ASK_WORKER, dynamo_env
from bench.prefix.chat import Chat, Pick, until
from tests.support.servers import EtcdServer, free_port

PEER = Path(__file__).resolve().parent.parent / "peer"
MODEL = "chat"
MOCKER_ARGS = ("--block-size", "16", "--num-gpu-blocks-override", "64", "--speedup-ratio", "1",
               "--max-num-seqs", "8", "--max-model-len", "4096")  # fmt: skip
FRONTENDS = {
    "kv": ("--router-mode", "kv"),
    "approximate": ("--router-mode", "kv", "--no-router-kv-events"),
    "random": ("--router-mode", "random"),
}
EXTRA = {"nvext": ASK_WORKER}
"""What every request through Dynamo's frontends adds: name the worker in the answer."""


@dataclass
class Theirs:
    model: str
    fronts: dict[str, str]

    def variants(self) -> dict[str, Pick]:
        return {variant: partial(str, url) for variant, url in self.fronts.items()}


def build_model(venv: Path, where: Path, chat: Chat) -> None:
    words = " ".join([*chat.words(), "user:", "assistant:"])
    argv = [str(peer_venv.python_of(venv)), str(PEER / "model.py"), str(where), words]
    subprocess.run(argv, capture_output=True, text=True, check=True)


@contextlib.asynccontextmanager
async def dynamo(scratch: Path, workers: int, chat: Chat) -> AsyncIterator[Theirs]:
    venv = peer_venv.default_dir()
    peer_venv.ensure(venv)
    python = str(peer_venv.python_of(venv))
    model_dir = scratch / "dynamo-model"
    build_model(venv, model_dir, chat)
    etcd = EtcdServer(scratch / "dynamo-etcd")
    with etcd:
        env = dynamo_env(etcd, scratch / "dynamo-home")
        mocker = [python, "-m", "dynamo.mocker", "--model-path", str(model_dir),
                  "--model-name", MODEL, *MOCKER_ARGS]  # fmt: skip
        procs = [
            Detached(f"Dynamo mocker {i}", mocker, env, scratch / f"dynamo-mocker-{i}.log")
            for i in range(workers)
        ]
        fronts: dict[str, str] = {}
        for variant, flags in FRONTENDS.items():
            port = free_port()
            fronts[variant] = f"http://127.0.0.1:{port}"
            argv = [python, "-m", "dynamo.frontend", "--http-host", "127.0.0.1",
                    "--http-port", str(port), *flags]  # fmt: skip
            log = scratch / f"dynamo-frontend-{variant}.log"
            procs.append(Detached(f"Dynamo frontend ({variant})", argv, env, log))
        async with contextlib.AsyncExitStack() as stack:
            for proc in procs:
                await stack.enter_async_context(detached(proc))
            async with aiohttp.ClientSession() as http:
                ids = await _worker_ids(http, fronts["random"], workers, procs)
                for url in fronts.values():
                    await until(partial(_knows_all, http, url, ids), f"{url} to see all workers")
            yield Theirs(MODEL, fronts)


async def _worker_ids(
    http: aiohttp.ClientSession, front: str, workers: int, procs: list[Detached]
) -> set[str]:
    """The workers' ids, learnt from answers of the random frontend (no other readiness
    signal names them); prompts shorter than a block leave nothing in the caches."""
    seen: set[str] = set()

    async def all_seen() -> bool:
        for proc in procs:
            proc.check_alive("waiting for Dynamo's workers")
        found = await _served_by(http, front, {})
        if found is not None:
            seen.add(found)
        return len(seen) == workers

    await until(all_seen, f"{workers} Dynamo mockers behind its random frontend", within=600)
    return seen


async def _knows_all(http: aiohttp.ClientSession, front: str, ids: set[str]) -> bool:
    for worker in ids:
        if await _served_by(http, front, {"backend_instance_id": int(worker)}) != worker:
            return False
    return True


async def _served_by(http: aiohttp.ClientSession, front: str, pin: dict[str, Any]) -> str | None:
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 1, "nvext": {**ASK_WORKER, **pin}}
    try:
        async with http.post(f"{front}/v1/completions", json=body) as response:
            if response.status != 200:
                return None
            answer = json.loads(await response.read())
    except aiohttp.ClientError:
        return None
    found = ((answer.get("nvext") or {}).get("worker_id") or {}).get("decode_worker_id")
    return None if found is None else str(found)
