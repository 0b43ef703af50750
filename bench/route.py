"""Routing benchmark, in process: decision latency and memory from 100 to 100,000 workers,
against the brute-force scan, and how long waking a waiting request takes.

    python -m bench.route            # 100 → 100,000 workers (a few minutes on 2 cores)
    python -m bench.route --quick    # 100 → 10,000

The fleet: every worker holds a capacity, a pool and a zone taint, in ``--groups``
combinations (16 by default: the "16 taint groups" of issue 17), so the router sees that
many groups however large the fleet; about one worker in 97 is cordoned in its own group
besides. Every request carries two preferred taints. Per fleet size and required taints
(none: every worker eligible; one: half; three: a sixteenth):

* ``route`` — a whole ``Router.acquire`` + ``release``: eligibility, the busy filter,
  scoring with the preferred taints, selection, the reservation and its release. This is
  the decision the front makes per request;
* ``scan`` — the same decision made the obvious way (the floor it replaces): every worker
  against the eligibility rule (``taints.matches`` and the cordon), the cost formula
  (``scoring.cost_terms``) for each eligible one, and the same selection;
* ``x`` — scan p50 / route p50, both measured in this run.

A last row repeats the largest fleet with 1,024 groups: a decision looks at one worker per
eligible group (``dynamod/router/choice.py``), so that is what it grows with.

Memory: ``router B/worker`` is what the router's table, groups and load orders allocate
per worker (``tracemalloc``, records excluded); ``view+router`` is a ``WorkerView`` and
its router fed the same fleet by a memory store, as the daemon wires them (the decoded
records, the view's maps and the snapshot it keeps, the router; not the store's own
copy); one worker record as discovery decodes it is printed below the table.

Wake latency: a request waits for a ``capacity/fast`` worker while the only one is busy;
``apply(WorkerModified)`` adds ``capacity/fast`` to an idle worker. ``dispatch`` is apply →
the waiter's worker reserved (inside ``apply``), ``resume`` is apply → the waiting task
running again; alone, behind 999 alike requests (one case: one decision answers for all),
and beside 999 requests in cases of their own (each requires a taint nobody holds, and
waits with ``max_wait``: the event does not concern them, so they cost a subset test
each, no decision). The floor is a bare ``Future.set_result`` → the awaiting task
resuming.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import statistics
import time
import tracemalloc
from collections import deque
from collections.abc import Awaitable, Callable

from dynamod.discovery_events import ViewResync, WorkerModified
from dynamod.errors import RoutingError, ShuttingDownError
from dynamod.load import IDLE
from dynamod.records import ModelCard, RuntimeConfig, WorkerRecord
from dynamod.router import (
    Assignment,
    Router,
    RouteRequest,
    RouterKnobs,
    cost_terms,
    select,
)
from dynamod.taints import CORDONED, RoutingConstraints, matches, normalize, preference

SIZES = (100, 1_000, 10_000, 100_000)
GROUPS = 16
MANY_GROUPS = 1_024
REQUIRED: dict[str, tuple[str, ...]] = {
    "all": (),
    "1/2": ("capacity/fast",),
    "1/16": ("capacity/fast", "pool=p1", "zone=z1"),
}
PREFERRED = {"pool=p2": 0.5, "zone=z1": -0.3}
CELL_SECONDS = 1.0  # time budget per measured cell
MAX_ROUNDS = 20_000
CARD = ModelCard(name="m", max_num_seqs=1 << 30)


def worker(index: int, *taints: str, card: ModelCard = CARD) -> WorkerRecord:
    return WorkerRecord(
        instance_id=f"{index:08x}",
        namespace="bench",
        component="backend",
        endpoint="generate",
        address=f"http://10.{index // 65536 % 256}.{index // 256 % 256}.{index % 256}:8000",
        model_card=card,
        runtime_config=RuntimeConfig(taints=normalize(taints)),
    )


def fleet_taints(index: int, groups: int) -> tuple[str, ...]:
    """A capacity, a pool and a zone: ``groups`` combinations in all (capacity halves the
    fleet, pool and zone split the rest), plus the cordon on about 1 in 97."""
    combo = index % groups
    pools = max(1, groups // 4)
    taints = (
        "capacity/fast" if combo % 2 else "capacity/slow",
        f"pool=p{combo // 2 % pools}",
        f"zone=z{combo // 2 // pools}",
    )
    return (*taints, CORDONED) if index % 97 == 0 else taints


def fleet(size: int, groups: int = GROUPS) -> list[WorkerRecord]:
    return [worker(i, *fleet_taints(i, groups)) for i in range(size)]


def scan(records: list[WorkerRecord], constraints: RoutingConstraints) -> list[WorkerRecord]:
    """Brute force: every worker against the rule."""
    need_cordon = CORDONED in constraints.required_taints
    return [
        w
        for w in records
        if matches(w.taints, constraints) and (need_cordon or CORDONED not in w.taints)
    ]


def scan_and_score(
    records: list[WorkerRecord], request: RouteRequest, config: RouterKnobs, rng: random.Random
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


def cuts(samples: list[float]) -> tuple[float, float]:
    """(p50, p99) in microseconds."""
    found = statistics.quantiles(samples, n=100, method="inclusive")
    return found[49] * 1e6, found[98] * 1e6


def memory(records: list[WorkerRecord]) -> tuple[Router, float]:
    """A router holding ``records``, and the bytes per worker its structures took."""
    router = Router(RouterKnobs(), rng=random.Random(1))
    snapshot = ViewResync(tuple(records), 1)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        router.apply(snapshot)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return router, grown / len(records)


async def view_memory(records: list[WorkerRecord]) -> float:
    """Bytes per worker of a ``WorkerView`` and its ``Router`` holding ``records``, as the
    daemon wires them, fed by a memory store (whose own copy is not counted): the records
    as decoded, the view's maps and history, the router's table."""
    from dynamod.discovery.registration import register
    from dynamod.discovery.view import WorkerView
    from dynamod.store import open_store

    async with await open_store("memory://") as store:
        lease = await store.grant(3600)
        for record in records:
            await register(store, record, lease)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            view, router = WorkerView(store), Router(RouterKnobs())
            view.listen(router.apply)
            async with asyncio.TaskGroup() as group:
                watching = group.create_task(view.run())
                await view.ready.wait()
                gc.collect()
                grown = tracemalloc.get_traced_memory()[0] - before
                watching.cancel()
        finally:
            tracemalloc.stop()
    return grown / len(records)


def record_bytes() -> float:
    """One record as discovery decodes it (its own card and runtime config, as parsed)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [
            WorkerRecord.from_json(worker(i, *fleet_taints(i, GROUPS)).to_json())
            for i in range(1000)
        ]
        for record in kept:
            _ = record.key  # computed once and kept, as the router reads it
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return grown / len(kept)


async def size_rows(size: int, groups: int) -> list[list[str]]:
    records = fleet(size, groups)
    router, per_worker = memory(records)
    with_view = await view_memory(records) if groups == GROUPS else None
    rows = []
    for share, taints in REQUIRED.items():
        constraints = RoutingConstraints(frozenset(taints), PREFERRED)
        eligible = len(scan(records, constraints))
        assert eligible == len(router.table.eligible("m", constraints))
        route, brute = await measure(router, records, constraints)
        (r50, r99), (s50, s99) = cuts(route), cuts(brute)
        rows.append([
            f"{size:,}", str(len(router.table.groups("m"))), share, f"{eligible:,}",
            f"{r50:.1f}", f"{r99:.1f}", f"{s50:.1f}", f"{s99:.1f}", f"{s50 / r50:.0f}",
            f"{per_worker:.0f}", "—" if with_view is None else f"{with_view:.0f}",
        ])  # fmt: skip
    router.close()
    return rows


async def measure(
    router: Router, records: list[WorkerRecord], constraints: RoutingConstraints
) -> tuple[list[float], list[float]]:
    """(route, scan) samples, in seconds."""
    request = RouteRequest("m", constraints, prompt_tokens=512)
    rng = random.Random(2)

    async def route() -> None:
        async with router.route(request):
            pass

    return await timed_async(route), timed(
        lambda: scan_and_score(records, request, router.knobs, rng)
    )


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


async def _wait_in_vain(router: Router, request: RouteRequest) -> None:
    """A request that waits until the router closes (a taint nobody holds)."""
    try:
        await router.acquire(request)
    except RoutingError:
        return


async def wake_latency(others: int, rounds: int, *, alike: bool) -> tuple[list[float], list[float]]:
    """(apply → dispatch, apply → resume) with ``others`` more requests waiting: ``alike``
    (the same constraints, queued behind the woken one), or each in a case of its own."""
    card = ModelCard(name="m", max_num_seqs=1)
    busy, idle = worker(0, "capacity/fast", card=card), worker(1, "capacity/slow", card=card)
    config = RouterKnobs(max_queue_wait=None, max_queue=others + 10)
    router = Router(config, rng=random.Random(3))
    router.apply(ViewResync((busy, idle), 1))
    fast = RouteRequest("m", RoutingConstraints(frozenset({"capacity/fast"})), prompt_tokens=64)
    held = await router.acquire(fast)
    stamps: dict[int, float] = {}
    dispatch, resume = [], []
    async with asyncio.TaskGroup() as tg:
        waiting = deque([tg.create_task(_acquire_stamped(router, fast, stamps))])
        for n in range(others):
            if alike:
                waiting.append(tg.create_task(_acquire_stamped(router, fast, stamps)))
            else:
                never = RoutingConstraints(frozenset({f"pool=nowhere{n}"}))
                tg.create_task(_wait_in_vain(router, RouteRequest("m", never, max_wait=3600)))
        await asyncio.sleep(0)
        for revision in range(2, 2 * rounds + 2, 2):
            event = WorkerModified(worker(1, "capacity/fast", card=card), (), (), revision)
            started = time.perf_counter()
            router.apply(event)
            dispatch.append(time.perf_counter() - started)
            woken = await waiting.popleft()
            assert woken is not None and woken.worker.key == idle.key
            resume.append(stamps.pop(id(woken)) - started)
            router.apply(WorkerModified(idle, (), (), revision + 1))
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


WAKE_ROWS = (
    ("1", 0, True),
    ("1,000 alike (1 case)", 999, True),
    ("1,000 in 1,000 cases", 999, False),
)
HEADERS = ["workers", "groups", "eligible", "", "route p50", "p99", "scan p50", "p99", "x",
           "router B/worker", "view+router"]  # fmt: skip


def table(rows: list[list[str]]) -> str:
    """Right-aligned columns; the third header cell is the share of the fleet eligible."""
    head = [*HEADERS[:2], "share", *HEADERS[2:3], *HEADERS[4:]]
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in (head, *rows)
    )


async def main(sizes: tuple[int, ...], rounds: int) -> None:
    print("decision latency, microseconds; 2 preferred taints on every request; route =")
    print("Router.acquire + release, scan = the brute-force decision; x = scan p50 / route p50")
    rows = []
    for size in sizes:
        rows += await size_rows(size, GROUPS)
    rows += (await size_rows(sizes[-1], MANY_GROUPS))[:1]
    print(table(rows))
    print(f"\none worker record as decoded: {record_bytes():.0f} B")
    print()
    print(f"wake latency after apply(WorkerModified), microseconds (p50 p99), {rounds} rounds")
    print(f"{'waiting':>26} {'dispatch':>19} {'resume':>19}")
    for label, others, alike in WAKE_ROWS:
        dispatch, resume = await wake_latency(others, rounds, alike=alike)
        (d50, d99), (r50, r99) = cuts(dispatch), cuts(resume)
        print(f"{label:>26} {d50:9.1f} {d99:9.1f} {r50:9.1f} {r99:9.1f}")
    f50, f99 = cuts(await bare_wake(rounds))
    print(f"{'floor':>26} {'':>19} {f50:9.1f} {f99:9.1f}  (bare future wake)")


def cli() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.route", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="skip the 100,000-worker fleet")
    parser.add_argument("--rounds", type=int, default=300, help="wake-up rounds per row")
    args = parser.parse_args()
    sizes = SIZES[:3] if args.quick else SIZES
    asyncio.run(main(sizes, args.rounds))


if __name__ == "__main__":
    cli()
