"""Pool policies bounded in cost (issue 28), in process: what a hostile document and a
thousand policies cost the daemon now, against floors measured in the same run.

    python -m bench.policy_bounds
    python -m bench.policy_bounds --policies 1000 --workers 2000

Rows:

* ``alias bomb refused`` — ``PoolPolicy.parse`` of the issue's 344-byte document (8 levels
  of ``&a [*prev x9]`` in ``name``); floor: parsing the README's honest policy. On main it
  took 28 s and 739 MB (the refusal's message expanded the value).
* ``deep JSON refused`` — a 30,000-level JSON document; floor: the honest policy as JSON.
* ``in_force`` — choosing the policies to reconcile among ``--policies`` of one model
  each; floor: ``overlaps`` of every pair, what it did before (issue: 1,000 policies
  starved placement).
* ``owned workers`` — every policy's selected workers out of ``--workers`` records, with
  ``owners.Owners`` (built once) and by scanning every record per policy (before).

Columns: wall-clock seconds of one run (best of ``--repeats``), and peak memory growth of
the process while it ran (``tracemalloc``).
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc
from collections.abc import Callable

from dynamod.errors import PoolPolicyError
from dynamod.pools.owners import Owners, required_field
from dynamod.pools.policy import PoolPolicy, overlaps
from dynamod.pools.stored import StoredPolicy, in_force
from dynamod.records import WorkerRecord
from tests.support.factories import make_record

HONEST = "name: split\nselector: model=llama\npools:\n  pool=fast: 40\n  pool=slow: 60\n"


def bomb(levels: int = 8) -> str:
    lines = ['x: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"x{n}: &a{n} [{','.join([f'*a{n - 1}'] * 9)}]" for n in range(1, levels)]
    lines.append(f"name: [{','.join([f'*a{levels - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


def measure(run: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Best wall-clock seconds of ``repeats`` runs, and the peak MB allocated by one."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    tracemalloc.start()
    run()
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return best, peak


def refused(text: str) -> Callable[[], object]:
    def run() -> object:
        try:
            return PoolPolicy.parse(text)
        except PoolPolicyError as exc:
            return exc

    return run


def pairwise(policies: list[StoredPolicy]) -> int:
    chosen: list[StoredPolicy] = []
    for stored in sorted(policies, key=lambda s: s.name):
        if not any(overlaps(c.policy, stored.policy) for c in chosen):
            chosen.append(stored)
    return len(chosen)


class _View:
    """The two things ``Owners`` reads of a ``WorkerView``."""

    def __init__(self, records: list[WorkerRecord]) -> None:
        self._records = records
        self.revision = 1

    def records(self) -> list[WorkerRecord]:
        return self._records

    def __len__(self) -> int:
        return len(self._records)

    def listen(self, _listener: object) -> Callable[[], None]:
        return lambda: None


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.policy_bounds")
    parser.add_argument("--policies", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n, w = args.policies, args.workers
    policies = [
        StoredPolicy(PoolPolicy(f"p{i}", f"model=m{i}", {"pool=a": 1, "pool=b": 1}), i + 1)
        for i in range(n)
    ]
    records = [make_record(model=f"m{i % n}") for i in range(w)]

    def indexed() -> int:
        owners = Owners(_View(records))  # type: ignore[arg-type]
        return sum(len(list(owners.of(p.policy.match))) for p in policies)

    def scanned() -> int:
        return sum(sum(p.policy.match.matches(r) for r in records) for p in policies)

    deep = '{"name": ' + "[" * 30_000 + "]" * 30_000 + "}"
    rows = [
        ("alias bomb refused (344 B)", refused(bomb()), refused(HONEST), "honest policy"),
        ("deep JSON refused (60 KB)", refused(deep), refused(json.dumps({})), "an empty one"),
        (f"in_force, {n} policies", lambda: in_force(policies), lambda: pairwise(policies),
         "every pair (before)"),
        (f"owned workers, {n} x {w}", indexed, scanned, "scan per policy (before)"),
    ]  # fmt: skip
    assert required_field(policies[0].policy.match) == ("model", "m0")
    print("| row | ours s | ours peak MB | floor s | floor peak MB | floor is |")
    print("|---|---|---|---|---|---|")
    for name, ours, floor, what in rows:
        ours_s, ours_mb = measure(ours, args.repeats)
        floor_s, floor_mb = measure(floor, 1 if "before" in what else args.repeats)
        print(
            f"| {name} | {ours_s:.4f} | {ours_mb:.1f} | {floor_s:.4f} | {floor_mb:.1f} | {what} |"
        )


if __name__ == "__main__":
    main()
