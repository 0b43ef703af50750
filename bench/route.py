"""Routing benchmark: decision latency by fleet size and required taints, and wake latency.

    python -m bench.route            # the full table (well under a minute on 2 cores)
    python -m bench.route --quick    # 100 and 1,000 workers only

Decision latency, beside a brute-force scan measured in the same run:

* ``index``  — ``RoutingTable.eligible``: intersect the required taints' sets;
* ``scan``   — the obvious filter: ``taints.matches`` + the cordon rule over every worker;
* ``route``  — a whole ``Router.acquire`` + ``release`` (eligibility, busy filter, scoring
  with two preferred taints, selection, reservation);
* ``scan+score`` — the naive decision: the scan, then the cost formula evaluated for
  every worker it found, and the same selection.

Wake latency: a request waits for a ``capacity/fast`` worker while the only one is busy;
``apply(TaintsUpdated)`` adds ``capacity/fast`` to an idle worker. ``dispatch`` is apply →
the waiter's worker reserved (inside ``apply``), ``resume`` is apply → the waiting task
running again. The floor is a bare ``Future.set_result`` → the awaiting task resuming.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections import deque
from collections.abc import Awaitable, Callable

from dynamod.errors import ShuttingDownError
from dynamod.load import IDLE
from dynamod.model import ModelCard, RuntimeConfig, TaintsUpdated, ViewResync, WorkerRecord
from dynamod.router import (
    Assignment,
    Router,
    RouterConfig,
    RouteRequest,
    cost_terms,
    select,
)
from dynamod.taints import CORDONED, RoutingConstraints, matches, normalize, preference

SIZES = (100, 1_000, 10_000)
REQUIRED: dict[int, tuple[str, ...]] = {
    0: (),
    1: ("capacity/fast",),
    3: ("capacity/fast", "pool=p1", "zone=z2"),
}
PREFERRED = {"gpu=h100": 0.5, "zone=z3": -0.3}
CELL_SECONDS = 0.5  # time budget per measured column and row
MAX_ROUNDS = 2_000


def worker(index: int, *taints: str, max_num_seqs: int = 1 << 30) -> WorkerRecord:
    card = ModelCard(name="m", max_num_seqs=max_num_seqs)
    return WorkerRecord(
        instance_id=f"{index:08x}",
        namespace="bench",
        component="backend",
        endpoint="generate",
        address=f"http://10.0.{index // 256 % 256}.{index % 256}:8000",
        model_card=card,
        runtime_config=RuntimeConfig(taints=normalize(taints)),
    )


def fleet(size: int) -> list[WorkerRecord]:
    """Workers with a mix of taints; about 1 % cordoned. The 3-taint filter keeps ~1/20."""
    return [
        worker(
            i,
            "capacity/fast" if i % 2 else "capacity/slow",
            f"pool=p{i % 4}",
            f"zone=z{i % 5}",
            "gpu=h100" if i % 3 == 0 else "gpu=a100",
            *((CORDONED,) if i % 97 == 0 else ()),
        )
        for i in range(size)
    ]


def scan(records: list[WorkerRecord], constraints: RoutingConstraints) -> list[WorkerRecord]:
    """Brute force: every worker against the rule."""
    need_cordon = CORDONED in constraints.required_taints
    return [
        w
        for w in records
        if matches(w.taints, constraints) and (need_cordon or CORDONED not in w.taints)
    ]


def scan_and_score(
    records: list[WorkerRecord], request: RouteRequest, config: RouterConfig, rng: random.Random
) -> WorkerRecord:
    found = scan(records, request.constraints)
    costs = [
        cost_terms(
            config,
            w.model_card.kv_block_size,
            IDLE,
            prompt_tokens=request.prompt_tokens,
            overlap_blocks=0,
            preference=preference(w.taints, request.constraints),
        ).cost
        for w in found
    ]
    return found[select(costs, config.temperature, rng)]


def timed(call: Callable[[], object]) -> list[float]:
    """Seconds per call, for up to ``CELL_SECONDS`` (at least 20 calls)."""
    samples: list[float] = []
    stop = time.perf_counter() + CELL_SECONDS
    while len(samples) < MAX_ROUNDS and (len(samples) < 20 or time.perf_counter() < stop):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return samples


async def timed_async(call: Callable[[], Awaitable[object]]) -> list[float]:
    samples: list[float] = []
    stop = time.perf_counter() + CELL_SECONDS
    while len(samples) < MAX_ROUNDS and (len(samples) < 20 or time.perf_counter() < stop):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    return samples


def p50_p99(samples: list[float]) -> str:
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return f"{cuts[49] * 1e6:9.1f} {cuts[98] * 1e6:9.1f}"


async def decision_rows(size: int) -> list[str]:
    records = fleet(size)
    router = Router(RouterConfig(), rng=random.Random(1))
    router.apply(ViewResync(tuple(records), 1))
    rows = []
    for count, taints in REQUIRED.items():
        constraints = RoutingConstraints(frozenset(taints), PREFERRED)
        found = router.table.eligible("m", constraints)
        assert {w.key for w in found} == {w.key for w in scan(records, constraints)}
        cells = await measure(router, records, constraints)
        rows.append(f"{size:>7} {count:>4} {len(found):>6} " + " ".join(map(p50_p99, cells)))
    return rows


async def measure(
    router: Router, records: list[WorkerRecord], constraints: RoutingConstraints
) -> list[list[float]]:
    """The four columns of one row."""
    request = RouteRequest("m", constraints, prompt_tokens=512)
    rng = random.Random(2)

    async def route() -> None:
        async with router.route(request):
            pass

    return [
        timed(lambda: router.table.eligible("m", constraints)),
        timed(lambda: scan(records, constraints)),
        await timed_async(route),
        timed(lambda: scan_and_score(records, request, router.config, rng)),
    ]


async def _acquire_stamped(
    router: Router, request: RouteRequest, stamps: dict[int, float]
) -> Assignment | None:
    """Acquire, noting when this task runs again; ``None`` when the router closed."""
    try:
        assignment = await router.acquire(request)
    except ShuttingDownError:
        return None
    stamps[id(assignment)] = time.perf_counter()
    return assignment


async def wake_latency(queue: int, rounds: int) -> tuple[list[float], list[float]]:
    """(apply → dispatch, apply → resume) with ``queue`` requests waiting."""
    busy = worker(0, "capacity/fast", max_num_seqs=1)
    idle = worker(1, "capacity/slow", max_num_seqs=1)
    router = Router(RouterConfig(max_queue_wait=None), rng=random.Random(3))
    router.apply(ViewResync((busy, idle), 1))
    fast = RouteRequest("m", RoutingConstraints(frozenset({"capacity/fast"})), prompt_tokens=64)
    held = await router.acquire(fast)
    stamps: dict[int, float] = {}
    dispatch, resume = [], []
    async with asyncio.TaskGroup() as tg:
        waiting = deque(
            tg.create_task(_acquire_stamped(router, fast, stamps)) for _ in range(queue)
        )
        await asyncio.sleep(0)
        for revision in range(2, 2 * rounds + 2, 2):
            event = TaintsUpdated(worker(1, "capacity/fast", max_num_seqs=1), (), (), revision)
            started = time.perf_counter()
            router.apply(event)
            dispatch.append(time.perf_counter() - started)
            woken = await waiting.popleft()
            assert woken is not None and woken.worker.key == idle.key
            resume.append(stamps.pop(id(woken)) - started)
            router.apply(TaintsUpdated(idle, (), (), revision + 1))
            router.release(woken)
            waiting.append(tg.create_task(_acquire_stamped(router, fast, stamps)))
            await asyncio.sleep(0)
        router.close()
    router.release(held)
    return dispatch, resume


async def bare_wake(rounds: int) -> list[float]:
    """The floor: ``Future.set_result`` → the awaiting task resumes."""
    loop = asyncio.get_running_loop()
    samples = []
    for _ in range(rounds):
        future: asyncio.Future[float] = loop.create_future()

        async def waiter(f: asyncio.Future[float] = future) -> float:
            await f
            return time.perf_counter()

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0)
        started = time.perf_counter()
        future.set_result(0.0)
        samples.append(await task - started)
    return samples


async def main(sizes: tuple[int, ...], rounds: int) -> None:
    print("decision latency, microseconds (p50 p99); 2 preferred taints on every request")
    head = f"{'':>19} {'index':>19} {'scan':>19} {'route':>19} {'scan+score':>19}"
    print(f"{'workers':>7} {'req':>4} {'elig':>6} {head[19:]}")
    for size in sizes:
        for row in await decision_rows(size):
            print(row)
    print()
    print(f"wake latency after apply(TaintsUpdated), microseconds (p50 p99), {rounds} rounds")
    print(f"{'waiting':>12} {'dispatch':>19} {'resume':>19}")
    for queue in (1, 1_000):
        dispatch, resume = await wake_latency(queue, rounds)
        print(f"{queue:>12} {p50_p99(dispatch)} {p50_p99(resume)}")
    print(f"{'floor':>12} {'':>19} {p50_p99(await bare_wake(rounds))}  (bare future wake)")


def cli() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.route", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="skip the 10,000-worker fleet")
    parser.add_argument("--rounds", type=int, default=300, help="wake-up rounds per row")
    args = parser.parse_args()
    sizes = SIZES[:2] if args.quick else SIZES
    asyncio.run(main(sizes, args.rounds))


if __name__ == "__main__":
    cli()
