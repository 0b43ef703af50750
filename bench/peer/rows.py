"""The peer benchmark's samples, and the rows of its table (ratios are dynamod / Dynamo).

Percentiles are nearest-rank over all rounds pooled. ``rounds`` holds the smallest and the
largest per-round ratio (each round's dynamod p50 over that round's Dynamo p50, or the
same for throughput): the spread the shared machine put on the ratio. Targets are
``dynamod`` and ``dynamo`` (the fronts) and ``dynamod-worker`` and ``dynamo-worker``
(their workers with no front: the floors).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.common import percentile
from bench.peer.measure import Load, TaintSample

FRONTS = ("dynamod", "dynamo")
Json = dict[str, Any]


@dataclass
class Raw:
    """Every sample of a run. ``samples[measure][target]`` is a list of rounds of ns."""

    samples: dict[str, dict[str, list[list[int]]]] = field(default_factory=dict)
    loads: dict[str, list[Load]] = field(default_factory=dict)
    taints: dict[str, list[list[TaintSample]]] = field(default_factory=dict)
    memory: dict[str, dict[str, float]] = field(default_factory=dict)

    def add(self, measure: str, target: str, ns: list[int]) -> None:
        self.samples.setdefault(measure, {}).setdefault(target, []).append(ns)

    def to_json(self) -> Json:
        return {
            "samples_ns": self.samples,
            "loads": {t: [asdict(load) for load in rounds] for t, rounds in self.loads.items()},
            "taints": {
                k: [[asdict(s) for s in r] for r in rounds] for k, rounds in self.taints.items()
            },
            "memory": self.memory,
        }


def pct(samples: Sequence[int], q: float) -> float:
    """The nearest-rank ``q`` quantile of ns samples, in ms."""
    return percentile(sorted(samples), q) / 1e6


def _flat(rounds: list[list[int]]) -> list[int]:
    return [x for r in rounds for x in r]


def row(
    measure: str,
    unit: str,
    better: str | None,
    values: dict[str, float],
    floors: dict[str, float] | None = None,
    rounds: list[float] | None = None,
) -> Json:
    """One line of the table; ``values`` and ``floors`` are keyed by front."""
    ours, dynamo = values["dynamod"], values["dynamo"]
    return {
        "measure": measure,
        "unit": unit,
        "better": better,
        "ours": ours,
        "dynamo": dynamo,
        "ratio": ours / dynamo if better and dynamo else None,
        "rounds": [min(rounds), max(rounds)] if rounds else None,
        "floor_ours": floors["dynamod"] if floors else None,
        "floor_dynamo": floors["dynamo"] if floors else None,
    }


def _ratios(ours: list[float], dynamo: list[float]) -> list[float]:
    return [o / d for o, d in zip(ours, dynamo, strict=True)]


def latency_rows(raw: Raw, measure: str, label: str) -> list[Json]:
    got = raw.samples[measure]
    out = []
    for q, name in ((0.50, "p50"), (0.99, "p99")):
        values = {f: pct(_flat(got[f]), q) for f in FRONTS}
        floors = {f: pct(_flat(got[f + "-worker"]), q) for f in FRONTS}
        per_round = _ratios(*([pct(r, q) for r in got[f]] for f in FRONTS)) if q == 0.5 else None
        out.append(row(f"{label} {name}", "ms", "lower", values, floors, per_round))
    return out


def throughput(loads: list[Load]) -> float:
    return sum(len(x.ns) for x in loads) / sum(x.seconds for x in loads)


def cpu_per_request_us(loads: list[Load], role: str) -> float:
    return sum(x.cpu_s[role] for x in loads) / sum(len(x.ns) for x in loads) * 1e6


def load_rows(raw: Raw) -> list[Json]:
    got = raw.loads
    per_round = _ratios(*([throughput([x]) for x in got[f]] for f in FRONTS))

    def each(measure: Callable[[list[Load]], float], suffix: str = "") -> dict[str, float]:
        return {f: measure(got[f + suffix]) for f in FRONTS}

    def cpu(role: str) -> Callable[[list[Load]], float]:
        return lambda loads: cpu_per_request_us(loads, role)

    def p50(loads: list[Load]) -> float:
        return pct(_flat([x.ns for x in loads]), 0.5)

    return [
        row("throughput", "req/s", "higher", each(throughput), each(throughput, "-worker"),
            per_round),
        row("latency p50 under that load", "ms", "lower", each(p50), each(p50, "-worker")),
        row("front CPU per request", "µs", "lower", each(cpu("front"))),
        row("worker CPU per request", "µs", "lower", each(cpu("worker")),
            each(cpu("worker"), "-worker")),
    ]  # fmt: skip


def taint_rows(raw: Raw) -> list[Json]:
    got = raw.taints

    def rounds(field: str, front: str) -> list[list[int]]:
        return [[getattr(s, field) for s in r] for r in got[front]]

    def each(field: str, q: float) -> dict[str, float]:
        return {f: pct(_flat(rounds(field, f)), q) for f in FRONTS}

    per_round = _ratios(*([pct(r, 0.5) for r in rounds("routed_ns", f)] for f in FRONTS))
    first = {f: 100 * sum(n == 1 for r in rounds("attempts", f) for n in r)
             / len(_flat(rounds("attempts", f))) for f in FRONTS}  # fmt: skip
    label = "taint POST returned → routed"
    return [
        row(f"{label} p50", "ms", "lower", each("routed_ns", 0.5), each("steady_ns", 0.5),
            per_round),
        row(f"{label} p99", "ms", "lower", each("routed_ns", 0.99), each("steady_ns", 0.99)),
        row("taint POST call p50", "ms", "lower", each("post_ns", 0.5)),
        row("routed at the first request", "%", None, first),
    ]  # fmt: skip


MEMORY = (
    ("front_start_mib", "front RSS after start"),
    ("front_end_mib", "front RSS after load"),
    ("front_peak_mib", "front peak RSS (VmHWM)"),
    ("worker_end_mib", "worker RSS after load"),
)


def memory_rows(raw: Raw) -> list[Json]:
    return [row(label, "MiB", "lower", {f: raw.memory[f][key] for f in FRONTS})
            for key, label in MEMORY]  # fmt: skip


def rows_of(raw: Raw) -> list[Json]:
    return [
        *latency_rows(raw, "seq", "sequential"),
        *load_rows(raw),
        *latency_rows(raw, "first_new", "first event, new connection,"),
        *latency_rows(raw, "first_kept", "first event, kept-alive,"),
        *taint_rows(raw),
        *memory_rows(raw),
    ]


DIGITS = {"ms": 2, "req/s": 0, "µs": 0, "MiB": 0, "%": 0}


def number(value: float | None, unit: str) -> str:
    return "—" if value is None else f"{value:.{DIGITS[unit]}f}"


def table_rows(rows: list[Json]) -> list[list[str]]:
    """The rows as text: the measure with its unit, values, ratio, per-round spread, floors."""
    want = {"lower": "≤ 1", "higher": "≥ 1", None: ""}
    out = []
    for r in rows:
        ratio = "—" if r["ratio"] is None else f"{r['ratio']:.2f}"
        spread = "—" if r["rounds"] is None else f"{r['rounds'][0]:.2f}-{r['rounds'][1]:.2f}"
        out.append([f"{r['measure']} ({r['unit']})", number(r["ours"], r["unit"]),
                    number(r["dynamo"], r["unit"]), ratio, spread,
                    number(r["floor_ours"], r["unit"]), number(r["floor_dynamo"], r["unit"]),
                    want[r["better"]]])  # fmt: skip
    return out
