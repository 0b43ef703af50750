"""What ``dynamoctl top`` shows of a frame (``dynamod.stats_results.FleetStats``): the
header lines, the table's columns and rows, and the JSON object of ``-o json``. Pure
functions; no I/O. The live screen and ``--once`` show the same lines and rows.

Columns: ID, MODEL, STATE, POOLS (the pool taints it holds), TAINTS (its other caller
taints), INFLIGHT (this dynamod's router's requests there), RUN / WAIT / KV (what its
engine reports: running, waiting, KV cache use; ``-`` when it reports nothing), RPS and
P50 (answers begun per second through this dynamod over the last interval, and their
median time to first byte), MARK (why the worker boundary marked it). Each column sorts
by the order of the same name (``COLUMN_SORTS``); ``load`` is no column.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from dynamod.taints import caller_taints

if TYPE_CHECKING:
    from dynamod.stats_results import FleetStats, WorkerStats

HEADERS = (
    "ID", "MODEL", "STATE", "POOLS", "TAINTS", "INFLIGHT", "RUN", "WAIT", "KV", "RPS", "P50",
    "MARK",
)  # fmt: skip
COLUMN_SORTS = (
    "id", "model", "state", "pools", "taints", "inflight", "running", "waiting", "kv", "rps",
    "p50", "mark",
)  # fmt: skip
"""The order each column of ``HEADERS`` sorts by (the daemon's ``SORTS``)."""
ORDERS = ("load", *COLUMN_SORTS)
"""What ``<`` and ``>`` step through, and ``--sort`` takes."""
NONE = "-"
STATE_ORDER = ("ready", "cordoned", "draining", "drained", "unhealthy")


def seconds(value: float | None) -> str:
    """``850us``, ``12ms``, ``1.4s``, ``-``."""
    if value is None:
        return NONE
    if value < 0.001:
        return f"{value * 1e6:.0f}us"
    if value < 1:
        return f"{value * 1e3:.0f}ms"
    return f"{value:.1f}s"


def rate(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def header_lines(stats: FleetStats, selector: str = "") -> list[str]:
    """The lines above the table: the daemon, its view and the time; the workers by state;
    the answers through this daemon and its queue; the pools and their leader."""
    when = datetime.fromtimestamp(stats.time).strftime("%H:%M:%S") if stats.time else NONE
    lag = f", watch lag p99 {seconds(stats.propagation_p99)}" if stats.propagation_p99 else ""
    lines = [f"dynamod {stats.replica or NONE}  {when}  revision {stats.revision}{lag}"]
    lines.append(_workers_line(stats, selector))
    if stats.interval:
        lines.append(
            f"answers {rate(stats.rps)}/s  first byte p50 {seconds(stats.first_byte_p50)} "
            f"p99 {seconds(stats.first_byte_p99)}  waiting in router {stats.queue_depth}"
        )
    else:
        lines.append(f"answers: sampling...  waiting in router {stats.queue_depth}")
    lines.append(_pools_line(stats))
    return lines


def _workers_line(stats: FleetStats, selector: str) -> str:
    counts = {str(k): v for k, v in stats.states.items()}
    known = [s for s in STATE_ORDER if counts.get(s)]
    states = ", ".join(f"{counts[s]} {s}" for s in known) or "none"
    matched = f" ({stats.matched} of {stats.workers} match {selector})" if selector else ""
    return f"workers {stats.matched if selector else stats.workers}: {states}{matched}"


def _pools_line(stats: FleetStats) -> str:
    if not stats.pools and not stats.leader:
        return "pools: no policy"
    by_policy: dict[str, list[str]] = {}
    for pool in stats.pools:
        by_policy.setdefault(pool.policy, []).append(f"{pool.pool} {pool.actual}/{pool.target}")
    shown = "; ".join(f"{name}: {', '.join(pools)}" for name, pools in by_policy.items())
    leader = f"leader {stats.leader} (epoch {stats.epoch})" if stats.leader else "NO LEADER"
    return f"pools {shown or '-'}  {leader}"


def row(worker: WorkerStats, id_length: int) -> list[str]:
    pools = set(worker.pools)
    others = [t for t in caller_taints(worker.taints) if t not in pools]
    engine = worker.running is not None
    return [
        worker.id[:id_length],
        worker.model,
        str(worker.state),
        ",".join(worker.pools) or NONE,
        ",".join(others) or NONE,
        str(worker.in_flight),
        str(worker.running) if engine else NONE,
        str(worker.waiting) if engine else NONE,
        f"{worker.kv_usage:.0%}" if worker.kv_usage is not None else NONE,
        rate(worker.rps),
        seconds(worker.first_byte_p50),
        worker.mark or NONE,
    ]


def rows(stats: FleetStats) -> list[list[str]]:
    return [row(w, stats.id_prefix) for w in stats.rows]


def sorted_by(sort: str, reverse: bool) -> str:
    """``sorted by load``, ``sorted by id, reversed``."""
    return f"sorted by {sort}{', reversed' if reverse else ''}"


def frame_object(stats: FleetStats) -> dict[str, Any]:
    """``-o json``: the frame. Keys are only ever added (an interface for scripts)."""
    return {
        "time": stats.time,
        "replica": stats.replica,
        "interval_seconds": stats.interval,
        "revision": stats.revision,
        "propagation_p99_seconds": stats.propagation_p99,
        "workers": stats.workers,
        "matched": stats.matched,
        "states": {str(k): v for k, v in sorted(stats.states.items())},
        "requests_per_second": stats.rps,
        "first_byte_p50_seconds": stats.first_byte_p50,
        "first_byte_p99_seconds": stats.first_byte_p99,
        "queue_depth": stats.queue_depth,
        "pools": [
            {"policy": p.policy, "pool": p.pool, "target": p.target, "actual": p.actual}
            for p in stats.pools
        ],
        "leader": stats.leader or None,
        "epoch": stats.epoch,
        "offset": stats.offset,
        "rows": [_row_object(w) for w in stats.rows],
    }


def _row_object(worker: WorkerStats) -> dict[str, Any]:
    return {
        "id": worker.id,
        "model": worker.model,
        "state": str(worker.state),
        "pools": list(worker.pools),
        "taints": list(worker.taints),
        "in_flight": worker.in_flight,
        "running": worker.running,
        "waiting": worker.waiting,
        "kv_usage": worker.kv_usage,
        "requests_per_second": worker.rps,
        "first_byte_p50_seconds": worker.first_byte_p50,
        "mark": worker.mark or None,
    }


def step(sort: str, by: int) -> str:
    """The order ``by`` places after ``sort`` in ``ORDERS`` (``<``: -1, ``>``: +1)."""
    index = ORDERS.index(sort) if sort in ORDERS else 0
    return ORDERS[(index + by) % len(ORDERS)]


def sorted_column(sort: str) -> int | None:
    """The column ``sort`` orders by (None for ``load``)."""
    return COLUMN_SORTS.index(sort) if sort in COLUMN_SORTS else None


def fitting_rows(height: int, header: Sequence[str]) -> int:
    """How many rows fit a screen ``height`` lines high under ``header`` (and the table's
    own header and the status line)."""
    return max(1, height - len(header) - 3)
