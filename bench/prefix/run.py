"""Prefix-cache hit rate and time to first token: KV-aware vs approximate vs random routing.

    python -m bench.prefix                        # the mocker, ~2 min
    python -m bench.prefix --engine vllm          # 2 vLLM workers on CPU (engines venv), ~6 min
    python -m bench.prefix --dynamo               # + NVIDIA Dynamo 1.6.1 on the same workload
    python -m bench.prefix --lag --memory         # event → index lag; index memory

The workload is ``prefix_chat.Chat``: multi-turn chat conversations, each turn resending
the whole history plus a new user message, over several workers whose KV caches are small
enough to evict (mocker: 4 workers of 64 blocks of 16 tokens; vLLM: 2 workers of
``num_gpu_blocks_override`` 48 blocks of 32 tokens). Variants, all on the same workers at
once, each round in a new order and with new words (so no variant inherits another's
cached blocks):

* ``kv``: through a ``dynamod`` that follows the workers' KV events (the default);
* ``approximate``: through a second ``dynamod`` with ``router.kv_blocks_per_worker = 0``
  (it credits what it routed, for ``prefix_ttl``);
* ``kv x2`` / ``approximate x2``: two such daemons each, every request to either at
  random (router replicas: an approximate one knows only what it routed itself);
* ``random``: each request straight to a worker picked uniformly at random (no front).

With ``--dynamo`` (mocker only), NVIDIA Dynamo 1.6.1 runs the same workload on its own
mockers with the same cache (``--block-size 16 --num-gpu-blocks-override 64``, the same
speed-up) on an etcd of their own (``dynamo.py``): its ``kv`` router with KV
events, with ``--no-router-kv-events`` (approximate), and ``--router-mode random``.

``--lag``: a mocker worker's KV events into an index in this process, through the real
events stream: engine publish → index holding it, p50 / p99, beside the floor (a
timestamped line over a loopback HTTP stream in the same run). ``--memory``: bytes per
indexed block (``tracemalloc``) for 1,048,576 blocks, and for the worker's mirror.

Prints tables; ``--json FILE`` (default ``bench/out/prefix-<UTC>.json``) feeds
``python -m bench.report --prefix FILE``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import random
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import interruptible, render_table, write_result
from bench.prefix.chat import Chat, Pick, Run, play, until
from bench.prefix.measure import lag, memory
from bench.prefix.report import HEADERS, table_rows
from dynamod import __version__
from tests.support.processes import Proc, daemon, running, worker

MOCKER_ARGS = ("--block-size", "16", "--num-kv-blocks", "64", "--speedup-ratio", "1",
               "--max-num-seqs", "8", "--context-length", "4096")  # fmt: skip
VLLM_BLOCKS = 48
APPROXIMATE = {"DYNAMO_ROUTER_KV_BLOCKS_PER_WORKER": "0"}


@dataclass
class Ours:
    """Our stack: workers, two KV-aware fronts, two approximate fronts (each a daemon)."""

    model: str
    kv: list[str]
    approximate: list[str]
    workers: list[str]

    def variants(self) -> dict[str, Any]:
        """One front per routing, and (``… x2``) two replicas of it, each request to either
        at random: an approximate router then knows only what it routed itself, while a
        KV-aware one learns every engine's cache whichever router sent the request."""
        rng = random.Random(0)
        return {
            "kv": lambda: self.kv[0],
            "approximate": lambda: self.approximate[0],
            "kv x2": lambda: rng.choice(self.kv),
            "approximate x2": lambda: rng.choice(self.approximate),
            "random": lambda: rng.choice(self.workers),
        }


@contextlib.asynccontextmanager
async def ours(engine: str, scratch: Path, workers: int) -> AsyncIterator[Ours]:
    store = (scratch / "store").as_uri()
    procs, model = _workers(engine, store, workers)
    async with contextlib.AsyncExitStack() as stack:
        started = await asyncio.gather(*(p.start(within=600) for p in procs))
        for proc in started:
            stack.push_async_callback(proc.kill)
        fronts: dict[str, list[str]] = {"kv": [], "approximate": []}
        for i in range(2):
            for mode, env in (("kv", {}), ("approximate", APPROXIMATE)):
                sock = scratch / f"{mode}-{i}.sock"
                front = await stack.enter_async_context(running(daemon(store, sock, **env)))
                fronts[mode].append(front.field("http"))
        async with aiohttp.ClientSession() as http:
            for url in fronts["kv"]:
                await until(partial(_follows, http, url, len(procs)), f"{url} to follow KV events")
        yield Ours(model, fronts["kv"], fronts["approximate"], [p.field("http") for p in procs])


def _workers(engine: str, store: str, n: int) -> tuple[list[Proc], str]:
    if engine == "mocker":
        return [worker(store, *MOCKER_ARGS, model="chat") for _ in range(n)], "chat"
    from bench.engines import engines_python, tiny_model
    from tests.engines.conftest import vllm_worker

    python = engines_python()
    model = tiny_model(python)
    blocks = ("--vllm-arg", f"num_gpu_blocks_override={VLLM_BLOCKS}")
    return [vllm_worker(python, model, store, *blocks) for _ in range(n)], "tiny"


async def _follows(http: aiohttp.ClientSession, front: str, workers: int) -> bool:
    """The KV-aware front follows every worker's KV events (workers started before the
    daemons, so both fronts' first snapshots already hold them all)."""
    async with http.get(f"{front}/metrics") as response:
        text = await response.text()
    return f"dynamod_kv_workers {float(workers)}" in text


async def rounds(args: argparse.Namespace, chat: Chat) -> list[dict[str, Any]]:
    """Every variant of every stack, ``rounds`` times, in a new order each round."""
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="bench-prefix-") as tmp:
        scratch = Path(tmp)
        async with contextlib.AsyncExitStack() as stack:
            mine = await stack.enter_async_context(ours(args.engine, scratch, args.workers))
            targets: list[tuple[str, str, Pick, str, dict[str, Any] | None]] = [
                ("dynamod", v, pick, mine.model, None) for v, pick in mine.variants().items()
            ]
            if args.dynamo:
                from bench.prefix.dynamo import EXTRA, dynamo

                theirs = await stack.enter_async_context(dynamo(scratch, args.workers, chat))
                for variant, pick in theirs.variants().items():
                    targets.append(("dynamo", variant, pick, theirs.model, EXTRA))
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
                for n in range(args.rounds):
                    order = targets if n % 2 == 0 else targets[::-1]
                    for i, (name, variant, pick, model, extra) in enumerate(order):
                        seed = 1000 * n + i + 17
                        run = await play(http, chat, seed, pick, model, Run(name, variant), extra)
                        print(
                            f"round {n + 1}: {name} {variant}: {run.summary()['hit_rate']:.3f}",
                            file=sys.stderr,
                        )
                        runs.append(run)
    return merged(runs)


def merged(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """One summary per (stack, variant), all its rounds' requests together."""
    groups: dict[tuple[str, str], Run] = {}
    for run in runs:
        into = groups.setdefault((run.stack, run.variant), Run(run.stack, run.variant))
        into.served += run.served
        into.seconds += run.seconds
    return [g.summary() for g in groups.values()]


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.prefix", description=__doc__.split("\n")[0])
    p.add_argument("--engine", choices=("mocker", "vllm"), default="mocker")
    p.add_argument("--workers", type=int, default=None, help="default: 4 mockers, 2 vLLM")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--sessions", type=int, default=12)
    p.add_argument("--turns", type=int, default=None, help="default: 6 (vLLM: 4, its 1024 tokens)")
    p.add_argument("--concurrency", type=int, default=6)
    p.add_argument("--dynamo", action="store_true", help="also NVIDIA Dynamo 1.6.1 (mocker)")
    p.add_argument("--no-chat", dest="chat", action="store_false", help="skip the workload")
    p.add_argument("--lag", action="store_true", help="event → index lag")
    p.add_argument("--memory", action="store_true", help="index memory per 1M blocks")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.workers is None:
        args.workers = 4 if args.engine == "mocker" else 2
    if args.turns is None:  # the tiny model's tokenizer makes a word ~3 tokens
        args.turns = 6 if args.engine == "mocker" else 4
    if args.dynamo and args.engine != "mocker":
        p.error("--dynamo compares mockers: use it with --engine mocker")
    return args


def run(args: argparse.Namespace) -> int:
    chat = Chat(args.sessions, args.turns, args.concurrency)
    document: dict[str, Any] = {
        "benchmark": "prefix",
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "dynamod": __version__,
        "argv": sys.argv[1:],
        "engine": args.engine,
        "workers": args.workers,
        "chat": asdict(chat),
        "machine": {"cpus": os.cpu_count(), "load_before": os.getloadavg()},
    }
    # The lag first: the stacks of the workload leave the machine busy for a while
    # after they stop (a dozen processes exiting).
    if args.lag:
        document["lag"] = found = asyncio.run(lag())
        print(f"event → index visible: p50 {found['p50_ms']:.3f} ms, p99 {found['p99_ms']:.3f} ms "
              f"(n={found['n']}); floor (a line over loopback HTTP): p50 "
              f"{found['floor_p50_ms']:.3f} ms, p99 {found['floor_p99_ms']:.3f} ms")  # fmt: skip
    if args.chat:
        summaries = asyncio.run(rounds(args, chat))
        document["runs"] = summaries
        print(render_table(HEADERS, table_rows(summaries)))
    if args.memory:
        document["memory"] = found = memory()
        for name, value in found.items():
            print(f"{name}: {value}")
    document["machine"]["load_after"] = os.getloadavg()
    write_result(document, "prefix", args.json)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return interruptible(lambda: run(parse(argv)))
