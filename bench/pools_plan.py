"""Pool plan benchmark, in process: how long ``plan()`` takes at 10, 1,000 and 10,000
owned workers, against floors measured in the same run.

    python -m bench.pools_plan                 # 10 / 1,000 / 10,000 workers
    python -m bench.pools_plan --repeats 300

The target (issue): a plan in 10 ms or less at 10,000 workers. Scenarios, each on a fleet
whose workers carry a random 0-7 requests in flight and 0-999 cached blocks, one in 97 not
routable (cordoned, draining or unhealthy):

* ``balanced`` — 40/60 over a fleet already at 40/60: no moves (what every re-plan on a
  heartbeat costs);
* ``balanced, assigned`` — the same, with the leader's memory of what it assigned to every
  worker (``plan(assigned=...)``), which is how a reconciler calls it (drift is looked for);
* ``40/60→50/50`` — a weight change: a tenth of the fleet moves, chosen by load;
* ``idle 40/60→50/50`` — the same on an idle fleet (every worker at 0 in flight, 0
  blocks): every worker of the shrinking pool ties and is hashed (the tie-break's worst
  case);
* ``all join`` — a fleet that starts at once, no worker in a pool: every worker moves;
* ``spread 3 zones`` — balanced, with ``spread_by: zone`` over three zones.

Columns: wall-clock p50 / p99, then the same plans' CPU time (this thread's), which the
machine's other load does not inflate. Floors: ``sort`` is ``sorted(workers, key=worker
id)``, one ordering of the members, the least a plan that looks at everyone could cost;
``pass`` is one loop that counts the workers per pool (the counting every plan does); both
over the same workers as the row's plan, timed in turn with it. ``x sort`` is plan p50 /
sort p50 (wall).
Percentiles are nearest-rank over ``--repeats`` plans (garbage collection left on, as in
the daemon); the machine's other load shows in p99.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import random
import time
from collections.abc import Callable, Sequence
from operator import attrgetter

from bench.common import Stats, render_table
from dynamod.pools.plan import OwnedWorker, plan
from dynamod.pools.policy import PoolPolicy

SIZES = (10, 1_000, 10_000)
FAST, SLOW = "pool=fast", "pool=slow"


def policy(fast: int, slow: int, **options: object) -> PoolPolicy:
    pools = {FAST: fast, SLOW: slow}
    return PoolPolicy.from_dict({"name": "bench", "selector": "model=m", "pools": pools, **options})


def fleet(size: int, *, idle: bool = False, pooled: bool = True) -> list[OwnedWorker]:
    """``size`` workers at 40/60 (or in no pool), in three zones, seeded."""
    rng = random.Random(size)
    workers = []
    for i in range(size):
        pool = (FAST,) if i % 10 < 4 else (SLOW,)
        workers.append(
            OwnedWorker(
                worker=f"{rng.getrandbits(64):016x}",
                pools=pool if pooled else (),
                in_flight=0 if idle else rng.randrange(8),
                cached_blocks=0 if idle else rng.randrange(1000),
                domain=f"zone-{i % 3}",
                routable=i % 97 != 96,
            )
        )
    rng.shuffle(workers)
    return workers


def settled(pol: PoolPolicy, workers: list[OwnedWorker]) -> list[OwnedWorker]:
    """``workers`` after ``pol``'s plan is applied: a fleet with nothing left to move."""
    to = {move.worker: move.to_pool for move in plan(pol, workers).moves}
    return [w._replace(pools=(to[w.worker],)) if w.worker in to else w for w in workers]


def timed(runs: Sequence[Callable[[], object]], repeats: int) -> list[tuple[Stats, Stats]]:
    """Wall and CPU time (this thread's) of each of ``runs``, ``repeats`` times, taken in
    turn (plan, floor, plan, floor, ...) so that the machine's other load hits all alike.
    On a shared machine wall time includes waiting for a core; CPU time is the work."""
    wall: list[list[int]] = [[] for _ in runs]
    cpu: list[list[int]] = [[] for _ in runs]
    for _ in range(repeats):
        for i, run in enumerate(runs):
            started, started_cpu = time.perf_counter_ns(), time.thread_time_ns()
            run()
            cpu[i].append(time.thread_time_ns() - started_cpu)
            wall[i].append(time.perf_counter_ns() - started)
    return [(Stats.of(w), Stats.of(c)) for w, c in zip(wall, cpu, strict=True)]


def count_pools(workers: Sequence[OwnedWorker]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for worker in workers:
        if worker.routable and len(worker.pools) == 1:
            counts[worker.pools[0]] = counts.get(worker.pools[0], 0) + 1
    return counts


def rows_for(size: int, repeats: int) -> list[list[str]]:
    split, zoned = policy(40, 60), policy(40, 60, spread_by="zone")
    varied = settled(split, fleet(size))
    idle = settled(split, fleet(size, idle=True))
    scenarios: list[tuple[str, PoolPolicy, list[OwnedWorker]]] = [
        ("balanced", split, varied),
        ("balanced, assigned", split, varied),
        ("40/60→50/50", policy(50, 50), varied),
        ("idle 40/60→50/50", policy(50, 50), idle),
        ("all join", split, fleet(size, pooled=False)),
        ("spread 3 zones", zoned, settled(zoned, varied)),
    ]
    by_id = attrgetter("worker")
    rows = []
    for name, pol, workers in scenarios:
        assigned = {w.worker: w.pools[0] for w in workers if w.pools} if "assigned" in name else {}
        runs: list[Callable[[], object]] = [
            functools.partial(plan, pol, workers, assigned=assigned),
            functools.partial(sorted, workers, key=by_id),
            functools.partial(count_pools, workers),
        ]
        moves = len(plan(pol, workers, assigned=assigned).moves)
        (wall, cpu), (sort, _), (one_pass, _) = timed(runs, repeats)
        rows.append(
            [
                f"{size:,}",
                name,
                str(moves),
                f"{wall.p50_ms:.3f}",
                f"{wall.p99_ms:.3f}",
                f"{cpu.p50_ms:.3f}",
                f"{cpu.p99_ms:.3f}",
                f"{sort.p50_ms:.3f}",
                f"{one_pass.p50_ms:.3f}",
                f"{wall.p50_ms / sort.p50_ms:.1f}x" if sort.p50_ms else "—",
            ]
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=200, help="plans per row (default 200)")
    args = parser.parse_args()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"# pools plan: {args.repeats} plans per row; python {platform.python_version()}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs, load average {load}; "
        "target p50 <= 10 ms at 10,000 workers\n"
    )
    headers = ["workers", "scenario", "moves", "p50 ms", "p99 ms", "cpu p50", "cpu p99"]
    headers += ["sort p50", "pass p50", "x sort"]
    rows = [row for size in SIZES for row in rows_for(size, args.repeats)]
    print(render_table(headers, rows))


if __name__ == "__main__":
    main()
