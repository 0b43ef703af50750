"""dynamod against NVIDIA Dynamo 1.6.1, side by side on one machine and one etcd.

    python -m bench.peer                          # ~2 min (+ ~90 s the first time: the venv)
    python -m bench.peer --rounds 2 --requests 200 --streams 40 --seconds 4 --updates 20

Two stacks run at once on one etcd, each one front and one mocker worker
(``stacks.py``): ``dynamod`` + ``dynamo-worker``, and Dynamo's frontend
(``--router-mode kv``, the one 1.6.1 mode that honours ``required_taints``) + Dynamo's
mocker with its taint route. Dynamo comes from PyPI into a cached venv outside the
repository (``venv.py``; the first run installs it, later runs download nothing), and
loads an offline model directory built here (``model.py``) whose tokenizer makes the
benchmark's 200-word prompt 200 tokens, as dynamod's does. Both mockers run 10^6 times
faster than simulated time, with the same block size; each request is the same 200-token
non-streaming completion of ``--max-tokens`` tokens.

Measured (``measure.py``), in ``--rounds`` rounds; within a round each measure runs
one block per target, back to back, the order of the targets reversed every other round,
so that the shared machine's load hits both stacks alike:

* sequential latency p50 / p99 (kept-alive connection);
* throughput with ``--concurrency`` closed-loop clients, and the CPU each process used;
* streaming time to the first event, on a new connection per request and kept alive;
* taint update → routed: the worker's own ``POST /engine/update/model_taints`` returning →
  the first request requiring the new taint answered by that worker (dynamod names the
  worker in ``x-dynamo-worker-id``; Dynamo in ``nvext.worker_id`` when asked);
* the fronts' resident memory after start and after the load.

Floors, measured in the same rounds: each worker with no front. dynamod's worker has the
same HTTP routes as the front, so its floor is the very same request sent to it. Dynamo's
worker has no HTTP route: its floor is the pre-tokenized request sent over Dynamo's own
request plane (``direct.py``, Dynamo's runtime client pinned to the worker), i.e. what
Dynamo's frontend adds on top is HTTP, tokenizing, routing and detokenizing. For a taint
update the floor is one more request requiring the taint once it routes.

Prints the table (ratios are dynamod / Dynamo) and writes JSON (``--json``, by default
``bench/out/peer-<UTC time>.json``); ``python -m bench.report --peer FILE`` turns that
into the section of ``bench/RESULTS.md`` and its plot.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import header, interruptible, render_table, versions, write_result
from bench.peer import venv as peer_venv
from bench.peer.measure import (
    Direct,
    Http,
    Load,
    Target,
    cpu_s,
    peak_rss_mib,
    rss_mib,
    taint_update,
)
from bench.peer.procs import Detached, detached
from bench.peer.rows import Raw, rows_of, table_rows
from bench.peer.stacks import MODEL, Stack, dynamo, dynamo_env, ours
from dynamod import __version__
from dynamod.tokenizers.simple import VOCABULARY
from tests.support.servers import EtcdServer

HERE = Path(__file__).resolve().parent
PROMPT_WORDS = 200
WARMUP = 50
HEADERS = ("measure", "dynamod", "Dynamo", "ratio", "per round", "floor: dynamod", "Dynamo",
           "want")  # fmt: skip


def prompt() -> str:
    """200 words of dynamod's tokenizer vocabulary, in a fixed order: 200 tokens there, and
    200 with the tokenizer ``model.py`` trains on these very words."""
    return " ".join(VOCABULARY[i * 37 % len(VOCABULARY)] for i in range(PROMPT_WORDS))


def commit() -> str:
    """The checkout's commit, ``+dirty`` when files differ from it: which code measured."""
    git = ["git", "-C", str(HERE)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    status = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True)  # fmt: skip
    if head.returncode != 0:
        return "unknown (not a git checkout)"
    return head.stdout.strip() + ("+dirty" if status.stdout.strip() else "")


def build_model(venv: Path, where: Path) -> list[int]:
    """Dynamo's model directory; the prompt's token ids there."""
    argv = [str(peer_venv.python_of(venv)), str(HERE / "model.py"), str(where), prompt()]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    ids: list[int] = json.loads(done.stdout)["prompt_ids"]
    return ids


@asynccontextmanager
async def direct_helper(
    venv: Path, etcd: EtcdServer, stack: Stack, ids: list[int], tokens: int, scratch: Path
) -> AsyncIterator[Direct]:
    argv = [str(peer_venv.python_of(venv)), str(HERE / "direct.py"), stack.worker_id,
            str(tokens)]  # fmt: skip
    env = dynamo_env(etcd, scratch / "dynamo-home")
    helper = Detached("Dynamo direct client", argv, env, scratch / "dynamo-direct.log", talk=True)
    async with detached(helper):
        ready = json.loads(await helper.ask(json.dumps(ids)))
        if ready != {"ready": True}:
            raise RuntimeError(f"Dynamo's direct client said {ready}")
        yield Direct("dynamo-worker", helper)


async def answers(targets: dict[str, Target], prompt_tokens: int, tokens: int) -> dict[str, Any]:
    """The usage each HTTP target reports for the benchmark's request, which must be the
    same prompt and answer sizes on all (``direct.py`` checks Dynamo's worker)."""
    found = {}
    async with aiohttp.ClientSession() as http:
        for name, target in targets.items():
            if isinstance(target, Http):
                async with http.post(target.url, data=target.body, headers=target.headers) as r:
                    usage = (await r.json(content_type=None)).get("usage") or {}
                sizes = (usage.get("prompt_tokens"), usage.get("completion_tokens"))
                if sizes != (prompt_tokens, tokens):
                    raise RuntimeError(
                        f"{name} counted {sizes[0]} prompt and {sizes[1]} answer tokens; the "
                        f"comparison needs {prompt_tokens} and {tokens} on every target"
                    )
                found[name] = usage
    return found


class Rounds:
    """The interleaved rounds; see the module docstring."""

    def __init__(self, args: argparse.Namespace, stacks: dict[str, Stack],
                 targets: dict[str, Target], pids: dict[str, dict[str, int]]) -> None:  # fmt: skip
        self.args, self.stacks, self.targets, self.pids = args, stacks, targets, pids
        self.raw = Raw()

    async def warm_up(self) -> None:
        for target in self.targets.values():
            await target.sequential(WARMUP)
            await target.first_event(WARMUP // 5, fresh=True)
            await target.closed_loop(self.args.concurrency, 1.0)

    async def run(self, http: aiohttp.ClientSession) -> Raw:
        for r in range(self.args.rounds):
            print(f"round {r + 1}/{self.args.rounds}", file=sys.stderr, flush=True)
            order = list(self.targets) if r % 2 == 0 else list(reversed(self.targets))
            n = self._per_round("requests")
            for name in order:
                self.raw.add("seq", name, await self.targets[name].sequential(n))
            n = self._per_round("streams")
            for name in order:
                for fresh, kind in ((True, "first_new"), (False, "first_kept")):
                    self.raw.add(kind, name, await self.targets[name].first_event(n, fresh=fresh))
            for name in order:
                self.raw.loads.setdefault(name, []).append(await self._load(name))
            for key in [k for k in order if k in self.stacks]:
                await self._taints(http, key, r)
        return self.raw

    def _per_round(self, what: str) -> int:
        return int(getattr(self.args, what) // self.args.rounds)

    async def _load(self, name: str) -> Load:
        pids = self.pids[name]
        before = {role: cpu_s(pid) for role, pid in pids.items()}
        client = time.process_time()
        seconds = self.args.seconds / self.args.rounds
        load = await self.targets[name].closed_loop(self.args.concurrency, seconds)
        load.cpu_s = {role: cpu_s(pid) - before[role] for role, pid in pids.items()}
        load.cpu_s.setdefault("client", time.process_time() - client)
        return load

    async def _taints(self, http: aiohttp.ClientSession, key: str, r: int) -> None:
        stack, n = self.stacks[key], self._per_round("updates")
        samples = [await taint_update(http, stack, f"peer/r{r}-u{i}") for i in range(n)]
        self.raw.taints.setdefault(key, []).append(samples)


async def measure(args: argparse.Namespace, venv: Path, etcd: EtcdServer, scratch: Path,
                  ids: list[int]) -> tuple[Raw, dict[str, Any]]:  # fmt: skip
    """Start both stacks and Dynamo's direct client; warm up; run the rounds. Returns the
    samples and what each HTTP target answered the benchmark's request before warming up."""
    body = {"model": MODEL, "prompt": prompt(), "max_tokens": args.max_tokens}
    async with (
        ours(etcd, scratch) as mine,
        dynamo(venv, etcd, scratch / "model", scratch) as theirs,
        direct_helper(venv, etcd, theirs, ids, args.max_tokens, scratch) as their_worker,
        aiohttp.ClientSession() as http,
    ):
        assert mine.direct is not None
        targets: dict[str, Target] = {
            "dynamod": Http("dynamod", mine.front, body),
            "dynamo": Http("dynamo", theirs.front, body),
            "dynamod-worker": Http("dynamod-worker", mine.direct, body),
            "dynamo-worker": their_worker,
        }
        pids = {
            "dynamod": {"front": mine.front_pid, "worker": mine.worker_pid},
            "dynamo": {"front": theirs.front_pid, "worker": theirs.worker_pid},
            "dynamod-worker": {"worker": mine.worker_pid},
            "dynamo-worker": {"worker": theirs.worker_pid, "client": their_worker.helper.pid},
        }
        stacks = {"dynamod": mine, "dynamo": theirs}
        rounds = Rounds(args, stacks, targets, pids)
        memory = {k: {"front_start_mib": rss_mib(s.front_pid)} for k, s in stacks.items()}
        answered = await answers(targets, len(ids), args.max_tokens)
        await rounds.warm_up()
        raw = await rounds.run(http)
        for key, stack in stacks.items():
            memory[key] |= {
                "front_end_mib": rss_mib(stack.front_pid),
                "front_peak_mib": peak_rss_mib(stack.front_pid),
                "worker_end_mib": rss_mib(stack.worker_pid),
            }
        raw.memory = memory
        return raw, answered


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--rounds", type=int, default=6, help="interleaved rounds (default 6)")
    add("--requests", type=int, default=1200, help="sequential requests per target (1200)")
    add("--streams", type=int, default=240, help="streamed requests per target and kind (240)")
    add("--seconds", type=float, default=18.0, help="closed-loop seconds per target (18)")
    add("--concurrency", type=int, default=32, help="closed-loop clients (32)")
    add("--updates", type=int, default=120, help="taint updates per stack (120)")
    add("--max-tokens", type=int, default=8, help="tokens per answer (8)")
    add("--dynamo-venv", type=Path, default=peer_venv.default_dir(),
        help=f"Dynamo's cached venv (default {peer_venv.default_dir()})")  # fmt: skip
    add("--json", type=Path, help="where to write the results (default bench/out/peer-<time>.json)")
    args = parser.parse_args(argv)
    for name in ("rounds", "concurrency", "max_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)} must be at least 1")
    for name in ("requests", "streams", "updates"):
        if getattr(args, name) < args.rounds:
            parser.error(f"--{name} {getattr(args, name)} must be at least --rounds {args.rounds}")
    if args.seconds <= 0:
        parser.error(f"--seconds {args.seconds:g} must be more than 0")
    return args


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    stamp = peer_venv.ensure(args.dynamo_venv)
    found = {"dynamod": __version__, **versions(), **stamp["packages"]}
    found.pop("nats-server")  # not part of either stack here
    detail = (f"{args.rounds} interleaved rounds, {PROMPT_WORDS}-token prompt, "
              f"{args.max_tokens} tokens out, one mocker each, one etcd")  # fmt: skip
    print(header("dynamod vs NVIDIA Dynamo 1.6.1", found, detail))
    machine: dict[str, Any] = {"cpus": len(os.sched_getaffinity(0)),
                               "python": platform.python_version(),
                               "load_before": os.getloadavg()}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="dynamod-peer-") as tmp:
        scratch = Path(tmp)
        ids = build_model(args.dynamo_venv, scratch / "model")
        etcd = EtcdServer(scratch / "etcd")
        with etcd:
            raw, answered = asyncio.run(measure(args, args.dynamo_venv, etcd, scratch, ids))
    machine["load_after"] = os.getloadavg()
    rows = rows_of(raw)
    print(render_table(HEADERS, table_rows(rows)))
    loads = (" ".join(f"{x:.1f}" for x in machine[k]) for k in ("load_before", "load_after"))
    print("# load average (1, 5, 15 min): {} before, {} after".format(*loads))
    now = datetime.datetime.now(datetime.UTC)
    document = {
        "benchmark": "peer",
        "generated": now.isoformat(timespec="seconds"),
        "command": " ".join(["python -m bench.peer", *argv]),
        "commit": commit(),
        "versions": found,
        "machine": machine,
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "dynamo_venv")}
        | {"prompt_tokens": len(ids), "router_mode": "kv", "warmup": WARMUP},
        "install": stamp,
        "answers": answered,
        "rows": rows,
        "raw": raw.to_json(),
    }
    write_result(document, "peer", args.json)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    return interruptible(lambda: run(parse(given), given))
