"""dynamod as the operator plane of a real NVIDIA Dynamo 1.6.1 fleet: what it costs.

    python -m bench.dynamo_fleet [--samples 30] [--cards 1000] [--runs 10] [--json PATH]
                                 [--results bench/RESULTS.md]

1. **Taint change → routed by Dynamo's frontend.** One etcd, Dynamo's frontend
   (``--router-mode kv``) and two mockers with Dynamo's own taint route
   (``tests/dynamo/fleet.py``), and a dynamod on ``dynamo+etcd://``. Each sample gives
   one worker a taint nobody holds (``taints set ID bench=N``), then sends requests
   requiring it to Dynamo's frontend back to back until one lands on that worker
   (``nvext.worker_id.decode_worker_id``). Three ways, interleaved sample by sample so
   background load falls on each alike:

   * ``curl`` to the worker's route: the floor (what Dynamo alone offers), and the same
     ``POST`` from this process (the floor of the Python client: no process to start);
   * ``dynamoctl taints set``: a fresh process, through dynamod, which posts the whole
     set to the same route and returns once the store shows it (its verification);
   * the Python client (``AsyncClient.update_model_taints``, one warm connection): the
     same path without dynamoctl's start-up.

   Columns: the command alone (start → it returned), start → routed, and how often the
   very first request after the command returned was already routed to the worker.

2. **Listing 1,000 Dynamo workers.** ``--cards`` synthetic cards and endpoint records on
   a private etcd, each worker on a lease of its own, shaped exactly like the captured
   ones (``tests/dynamo/values.py``); a dynamod on ``dynamo+etcd://``: its start → ready
   (the first snapshot read and joined), then ``dynamoctl workers ls`` (table, ``-o
   json``, a selector), ``--runs`` fresh processes each. Floors, in the same run:
   ``etcdctl get --prefix v1/mdc`` (a Go CLI reading the same cards raw), and a dynamod
   on as many of its own worker records, on the same etcd: its start and its listing.

Needs Dynamo's venv (``bench/peer/venv.py`` builds it when missing, ~60 s). Tables on
stdout; ``--json`` writes the figures; ``--results`` writes the "Dynamo fleets" section
of ``bench/RESULTS.md`` (``bench.report`` keeps it when it regenerates the rest).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from bench.common import Stats, header, interruptible, markdown_table, ms, render_table
from bench.ctl_commands import Case, cli_env, fleet, interleaved
from bench.peer import venv as peer_venv
from bench.report import DYNAMO_FLEETS as TITLE
from bench.report import splice
from dynamod.client import AsyncClient
from dynamod.discovery.registration import register
from dynamod.store import Store
from dynamod.store.etcd import EtcdStore
from tests.dynamo import values
from tests.dynamo.fleet import DynamoFleet, WorkerSpec, build_model, post_json
from tests.support.processes import daemon_argv, dynamoctl, started
from tests.support.servers import EtcdServer, etcd_binary

ROUTED_WITHIN = 10.0
Json = dict[str, Any]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    venv = peer_venv.default_dir()
    stamp = peer_venv.ensure(venv)
    dynamo = stamp["packages"].get("ai-dynamo", "?")
    print(header("Dynamo fleets", {"ai-dynamo": dynamo, "python": platform.python_version()},
                 f"{args.samples} taint changes per way, {args.cards} cards"))  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="dynamod-bench-dynamo-") as scratch:
        work = Path(scratch)
        model = build_model(venv, work / "model")
        changes = taint_changes(venv, model, work / "routed", args.samples)
        listing = listings(work / "listing", args.cards, args.runs)
    document = {"command": shlex.join(["python", "-m", "bench.dynamo_fleet", *sys.argv[1:]]),
                "ai_dynamo": dynamo, "load_before": os.getloadavg(),
                "taint_changes": changes, "listing": listing}  # fmt: skip
    print(render_table(*change_table(changes)))
    print()
    print(render_table(*listing_table(listing)))
    if args.json:
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    if args.results:
        previous = args.results.read_text() if args.results.exists() else "# Benchmark results\n"
        args.results.write_text(splice(previous, TITLE, section(document)))
        print(f"wrote the Dynamo fleets section of {args.results}", file=sys.stderr)
    return 0


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=30, help="taint changes per way")
    parser.add_argument("--cards", type=int, default=1000, help="Dynamo workers to list")
    parser.add_argument("--runs", type=int, default=10, help="dynamoctl runs per listing")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--results", type=Path, help="splice the section into this file")
    return parser.parse_args(argv)


# -- 1. a taint change, until Dynamo's frontend routes on it ---------------------------------


def taint_changes(venv: Path, model: Path, work: Path, samples: int) -> Json:
    specs = (WorkerSpec("w0"), WorkerSpec("w1"))
    with DynamoFleet(venv, model, work, "etcd", specs) as dynamo:
        socket = work / "d.sock"
        daemon = started(daemon_argv(dynamo.store_url, socket), r"^dynamod ready:",
                         work / "dynamod.log")  # fmt: skip
        try:
            with asyncio.Runner() as runner:
                client = AsyncClient(f"unix://{socket}", timeout=30)
                ways = _ways(dynamo, socket, runner, client)
                found = _measure(dynamo, ways, samples)
                runner.run(client.close())
        finally:
            daemon.finish()
    return found


Way = Callable[[str, str], None]  # (worker id, taint) → returns once the command has


def _ways(
    dynamo: DynamoFleet, socket: Path, runner: asyncio.Runner, client: AsyncClient
) -> dict[str, Way]:
    systems = {w.id: w.system for w in dynamo.workers.values()}
    environ = cli_env(f"unix://{socket}", socket.parent / "pycache")

    def curl(worker: str, taint: str) -> None:
        body = json.dumps({"taints": [taint]})
        _run(["curl", "-sf", "-X", "POST", "-d", body,
              f"{systems[worker]}/engine/update/model_taints"], os.environ.copy())  # fmt: skip

    def post(worker: str, taint: str) -> None:
        status, _ = post_json(f"{systems[worker]}/engine/update/model_taints", {"taints": [taint]})
        if status != 200:
            raise RuntimeError(f"the route of {worker} answered {status}")

    def ctl(worker: str, taint: str) -> None:
        _run(dynamoctl("taints", "set", worker, taint), environ)

    def python(worker: str, taint: str) -> None:
        runner.run(client.update_model_taints(worker, [taint]))

    return {"curl to the route (floor)": curl, "dynamoctl taints set": ctl,
            "POST to the route, in process (floor)": post, "Python client": python}  # fmt: skip


def _measure(dynamo: DynamoFleet, ways: dict[str, Way], samples: int) -> Json:
    workers = list(dynamo.workers.values())
    found: dict[str, dict[str, list[int]]] = {
        name: {"command": [], "routed": [], "first": []} for name in ways
    }
    for index in range(samples + 1):  # the first round warms every way up
        for name, way in ways.items():
            target = workers[index % 2]
            taint = f"bench={index}-{len(found[name]['command'])}-{name.split()[0]}"
            started = time.perf_counter_ns()
            way(target.id, taint)
            returned = time.perf_counter_ns()
            first = dynamo.routed_to([taint]) == target.instance_id
            while not first and dynamo.routed_to([taint]) != target.instance_id:
                if time.perf_counter_ns() - started > ROUTED_WITHIN * 1e9:
                    raise RuntimeError(f"{name}: {taint} was not routed to {target.id}")
            routed = time.perf_counter_ns()
            if index:
                found[name]["command"].append(returned - started)
                found[name]["routed"].append(routed - started)
                found[name]["first"].append(int(first))
    return {name: _summary(series) for name, series in found.items()}


def _summary(series: dict[str, list[int]]) -> Json:
    command, routed = Stats.of(series["command"]), Stats.of(series["routed"])
    return {"command": vars(command), "routed": vars(routed),
            "first_routed": sum(series["first"]), "samples": len(series["first"])}  # fmt: skip


def _run(argv: list[str], environ: dict[str, str]) -> None:
    done = subprocess.run(argv, capture_output=True, env=environ, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {done.returncode}: {done.stderr.decode()}")


def change_table(found: Json) -> tuple[list[str], list[list[str]]]:
    headers = ["way", "command p50 ms", "p99", "→ routed p50 ms", "p99", "first request routed"]
    rows = [
        [name, ms(d["command"]["p50_ms"]), ms(d["command"]["p99_ms"]), ms(d["routed"]["p50_ms"]),
         ms(d["routed"]["p99_ms"]), f"{d['first_routed']} of {d['samples']}"]
        for name, d in found.items()
    ]  # fmt: skip
    return headers, rows


# -- 2. listing a fleet of Dynamo cards -----------------------------------------------------


def listings(work: Path, cards: int, runs: int) -> Json:
    work.mkdir(parents=True)
    etcd = EtcdServer(work / "etcd")
    etcd.start()
    try:
        asyncio.run(_write_cards(etcd.url(), cards))
        asyncio.run(_write_native(etcd.url("native"), cards))
        dynamo, native = work / "dynamo", work / "native"
        dynamo.mkdir()
        native.mkdir()
        ready = rf"^dynamod ready:.* workers={cards} "
        began = time.monotonic()
        argv = daemon_argv(f"dynamo+etcd://{etcd.endpoint}", dynamo / "d.sock")
        watching = started(argv, ready, dynamo / "dynamod.log")
        up = time.monotonic() - began
        rss = psutil.Process(watching.proc.pid).memory_info().rss
        argv = daemon_argv(etcd.url("native"), native / "d.sock")
        began = time.monotonic()
        theirs = started(argv, ready, native / "dynamod.log")
        own = time.monotonic() - began
        try:
            rows = interleaved(_cases(etcd, dynamo, native, work), runs)
        finally:
            watching.finish()
            theirs.finish()
    finally:
        etcd.stop()
    return {"cards": cards, "ready_s": up, "own_ready_s": own, "daemon_rss_mb": rss / 2**20,
            "rows": {row.name: vars(row.stats) for row in rows}}  # fmt: skip


def _cases(etcd: EtcdServer, dynamo: Path, native: Path, work: Path) -> list[Case]:
    ours, theirs = (cli_env(f"unix://{d / 'd.sock'}", work / "pycache") for d in (dynamo, native))
    etcdctl = [str(etcd_binary().with_name("etcdctl")), f"--endpoints={etcd.endpoint}"]
    return [
        Case("etcdctl get --prefix v1/mdc (floor)", lambda: [*etcdctl, "get", "--prefix", "v1/mdc"],
             dict(os.environ)),
        Case("dynamoctl workers ls, dynamod's own records (floor)",
             lambda: dynamoctl("workers", "ls"), theirs),
        Case("dynamoctl workers ls", lambda: dynamoctl("workers", "ls"), ours),
        Case("dynamoctl workers ls -o json", lambda: dynamoctl("workers", "ls", "-o", "json"),
             ours),
        Case("dynamoctl workers ls -l pool=p1",
             lambda: dynamoctl("workers", "ls", "-l", "pool=p1"), ours),
    ]  # fmt: skip


async def _write_cards(url: str, cards: int) -> None:
    """``cards`` Dynamo workers, as Dynamo registers them: a lease each, the card, then the
    endpoint record; a quarter in zone a, one in four more taints."""
    etcd = await EtcdStore.open(url)
    try:
        gate = asyncio.Semaphore(32)

        async def one(index: int) -> None:
            number = 0x13B0A2323C000000 + index
            card = values.card(number, taints=[f"pool=p{index % 4}", "gpu"],
                               zone="a" if index % 4 == 0 else None,
                               system=f"10.0.{index // 250}.{index % 250}:9090")  # fmt: skip
            async with gate:
                lease = await etcd.grant(600)
                await etcd.put(values.card_key(number), card, lease=lease)
                await etcd.put(values.instance_key(number), values.instance(number), lease=lease)

        await asyncio.gather(*(one(i) for i in range(cards)))
    finally:
        await etcd.aclose()


async def _write_native(url: str, count: int) -> None:
    store: Store = await EtcdStore.open(url)
    try:
        lease = await store.grant(600)
        for record in fleet(count):
            await register(store, record, lease)
    finally:
        await store.aclose()


def listing_table(found: Json) -> tuple[list[str], list[list[str]]]:
    headers = ["command", "p50 ms", "p99", "min"]
    rows = [[name, ms(s["p50_ms"]), ms(s["p99_ms"]), ms(s["min_ms"])]
            for name, s in found["rows"].items()]  # fmt: skip
    rows.append([f"dynamod start → ready with {found['cards']} of its own records (floor)",
                 ms(found["own_ready_s"] * 1000), "—", "—"])  # fmt: skip
    rows.append([f"dynamod start → ready with {found['cards']} Dynamo cards",
                 ms(found["ready_s"] * 1000), "—", "—"])  # fmt: skip
    return headers, rows


def section(document: Json) -> list[str]:
    changes, listing = document["taint_changes"], document["listing"]
    load = "/".join(f"{x:.1f}" for x in document["load_before"])
    lines = [
        f"`{document['command']}`: ai-dynamo {document['ai_dynamo']}, etcd 3.5.1, Python "
        f"{platform.python_version()}, {os.cpu_count()} CPUs, load average {load} before it. "
        "Written by the script itself (`--results`); `bench.report` keeps it.",
        "",
        "Taint change → routed by Dynamo's frontend (`--router-mode kv`), two mockers with "
        "Dynamo's own route, the ways interleaved sample by sample:",
        "",
        *markdown_table(*change_table(changes)),
        f"Listing {listing['cards']:,} Dynamo workers (synthetic cards shaped like the "
        f"captured ones, a lease each) through `dynamoctl`, fresh processes; daemon RSS "
        f"after start {listing['daemon_rss_mb']:.0f} MB:",
        "",
        *markdown_table(*listing_table(listing)),
    ]
    return lines


if __name__ == "__main__":
    sys.exit(interruptible(main))
