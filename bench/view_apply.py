"""What one taint-only change costs the daemon's worker view and router, in process.

    python -m bench.view_apply                    # 1,000 and 10,000 workers
    python -m bench.view_apply --sizes 1000 --rounds 3

The fleet is ``--sizes`` records of one model, each holding ``pool=fast`` or ``pool=slow``
(as ``bench.pools`` moves them). A round moves every worker to the other pool: one store
``Put`` per worker, its record written as a worker's taint update writes it. Per event,
the median over ``--rounds`` rounds of:

* ``translate full``: ``EventTranslator(fast=False)``, every ``Put`` read by the full
  path (the depth check, ``WorkerRecord.from_json``, ``immutable_diff``): the floor, what
  every event cost before the fast path;
* ``translate fast``: ``EventTranslator()``, the fast path for a taint-only change
  (``discovery/translate.py``);
* ``router apply``: ``Router.apply`` of the ``WorkerModified`` the translator made, as
  the daemon's view hands it on.

``x`` is full / fast, both measured in this run. ``bench.pools`` is the same path end to
end on etcd, with two daemons.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from bench.common import header, interruptible, render_table
from dynamod.discovery.translate import EventTranslator
from dynamod.discovery_events import DiscoveryEvent
from dynamod.records import WorkerRecord
from dynamod.router import Router
from dynamod.store import Entry, Put
from tests.support.factories import make_record

HEADERS = ("workers", "translate full µs", "translate fast µs", "x", "router apply µs")
POOLS = ("pool=fast", "pool=slow")
T = TypeVar("T")


def _rounds(records: list[WorkerRecord], rounds: int) -> list[list[Put]]:
    """``rounds`` rounds of moves, each worker to the other pool, at rising revisions."""
    revision = 2
    out = []
    for number in range(rounds):
        puts = []
        for index, record in enumerate(records):
            pool = POOLS[(index + number + 1) % 2]
            value = record.with_caller_taints([pool]).to_bytes()
            puts.append(Put(Entry(record.key, value, revision)))
            revision += 1
        out.append(puts)
    return out


def _per_event(step: Callable[[T], object], items: Sequence[T]) -> float:
    """Microseconds per item of ``step`` run on each of ``items``."""
    started = time.perf_counter()
    for item in items:
        step(item)
    return (time.perf_counter() - started) / len(items) * 1e6


def measure(size: int, rounds: int) -> list[str]:
    records = [make_record(model="pools", taints=[POOLS[i % 2]]) for i in range(size)]
    registered = [Put(Entry(r.key, r.to_bytes(), 1)) for r in records]
    moves = _rounds(records, rounds)
    costs: dict[str, list[float]] = {"full": [], "fast": [], "router": []}
    for fast in (False, True):
        translator = EventTranslator(fast=fast)
        for put in registered:
            translator.translate(put)
        for puts in moves:
            costs["fast" if fast else "full"].append(_per_event(translator.translate, puts))
    router = Router()
    translator = EventTranslator()
    for put in registered:
        for event in translator.translate(put):
            router.apply(event)
    for puts in moves:
        events: list[DiscoveryEvent] = [e for p in puts for e in translator.translate(p)]
        costs["router"].append(_per_event(router.apply, events))
    full, quick, route = (statistics.median(costs[k]) for k in ("full", "fast", "router"))
    return [f"{size:,}", f"{full:.1f}", f"{quick:.1f}", f"{full / quick:.1f}", f"{route:.1f}"]


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.view_apply", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rounds", type=int, default=5)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    detail = f"fleets of {', '.join(f'{s:,}' for s in args.sizes)}; {args.rounds} rounds"
    found = {"python": platform.python_version()}
    print(header("taint-only change: worker view and router, per event", found, detail))
    rows = [measure(size, args.rounds) for size in args.sizes]
    print(render_table(HEADERS, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(interruptible(main))
