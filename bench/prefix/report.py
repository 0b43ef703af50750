"""The prefix-routing section of ``bench/RESULTS.md`` and its plot, from ``bench.prefix``'s
JSON.

``bench.report --prefix FILE [FILE ...]`` calls these (a part per file: the mocker's
run, a vLLM run) and touches no other section; a full ``bench.report`` keeps this
section as it is (it never runs ``bench.prefix``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; before pyplot is imported
import matplotlib.pyplot as plt

from bench.common import markdown_table

TITLE = "Prefix routing from KV events (`bench.prefix`)"
PLOT = "prefix_hit_rate.png"
Json = dict[str, Any]
HEADERS = ("stack", "routing", "requests", "hit rate", "vs random", "TTFT p50 ms",
           "TTFT p99 ms", "stickiness", "balance")  # fmt: skip


def table_rows(summaries: list[Json]) -> list[list[str]]:
    """One row per (stack, routing); ``vs random`` is the hit rate over the same stack's
    random routing (the floor: no affinity at all)."""
    floors = {s["stack"]: s["hit_rate"] for s in summaries if s["variant"] == "random"}
    rows = []
    for s in summaries:
        floor = floors.get(s["stack"])
        rows.append([
            s["stack"], s["variant"], str(s["requests"]), f"{s['hit_rate']:.3f}",
            f"{s['hit_rate'] / floor:.2f}x" if floor else "—",
            _ms(s["ttft_p50_ms"]), _ms(s["ttft_p99_ms"]),
            "—" if s["stickiness"] is None else f"{s['stickiness']:.2f}",
            "—" if s["balance"] is None else f"{s['balance']:.2f}",
        ])  # fmt: skip
    return rows


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def bars(summaries: list[Json], width: int = 40) -> list[str]:
    """The hit rates as a Unicode bar plot (readable where the PNG is not shown)."""
    out = []
    for s in summaries:
        filled = round(s["hit_rate"] * width)
        label = f"{s['stack']} {s['variant']}"
        out.append(f"{label:<22} {'█' * filled}{'·' * (width - filled)} {s['hit_rate']:.3f}")
    return ["```", *out, "```"]


def section(runs: list[Json], sources: list[str]) -> list[str]:
    """Markdown lines for the section body (the caller writes the ``## TITLE`` line): one
    part per run (``sources`` name their files), then the plot of them all."""
    lines = []
    for run, source in zip(runs, sources, strict=True):
        lines += _part(run, source)
    return [*lines, f"![hit rate and TTFT by routing](plots/{PLOT})", ""]


def _part(run: Json, source: str) -> list[str]:
    lines = [f"### {run['engine']} workers", "", *_intro(run, source), ""]
    if run.get("runs"):
        lines += [*markdown_table(HEADERS, table_rows(run["runs"])), *bars(run["runs"]), ""]
    if "lag" in run:
        lag = run["lag"]
        lines += [
            f"Event → index visible (`--lag`, {lag['n']} KV batches from a real mocker "
            f"worker's events stream into a `KvIndex` in the benchmark's process): p50 "
            f"{lag['p50_ms']:.3f} ms, p99 {lag['p99_ms']:.3f} ms, max {lag['max_ms']:.3f} ms; "
            f"floor (a timestamped line over a loopback HTTP stream, same run): p50 "
            f"{lag['floor_p50_ms']:.3f} ms, p99 {lag['floor_p99_ms']:.3f} ms. Target p99 ≤ 5 ms: "
            f"{'met' if lag['p99_ms'] <= 5 else 'not met'} in this run.",
            "",
        ]
    if "memory" in run:
        m = run["memory"]
        lines += [
            "Memory (`--memory`, `tracemalloc`, 1,048,576 blocks of 16 tokens): the router's "
            f"index {m['index_bytes_per_block']} B a block ({m['index_mib_per_1m_blocks']} "
            f"MiB per 1M blocks), {m['index_bytes_per_block_held_by_two']} B a (worker, "
            f"block) entry when two workers hold each block; a worker's mirror (for the "
            f"snapshot a new connection gets) {m['mirror_bytes_per_block']} B a block "
            f"({m['mirror_mib_per_1m_blocks']} MiB per 1M blocks).",
            "",
        ]
    return lines


def _intro(run: Json, source: str) -> list[str]:
    chat, machine = run["chat"], run.get("machine", {})
    load = "/".join(f"{x:.1f}" for x in machine.get("load_before", ()))
    after = "/".join(f"{x:.1f}" for x in machine.get("load_after", ()))
    return [
        f"`python -m bench.prefix {' '.join(run['argv'])}` at {run['when']} "
        f"({machine.get('cpus', '?')} CPUs shared with other engineers' test runs; load "
        f"average {load} before, {after} after), turned into this section by `python -m "
        f"bench.report --prefix bench/out/{source}`. Engine: {run['engine']}, "
        f"{run['workers']} workers; dynamod {run['dynamod']}.",
        "",
        f"Workload: {chat['sessions']} multi-turn chat sessions of {chat['turns']} turns, "
        f"{chat['concurrency']} at once; each turn resends the whole history plus "
        f"{chat['user_words']} new words (the assistant's {chat['reply_words']}-word replies "
        "are fixed text of the workload, so every routing sees the same prompts). Caches are "
        "small enough to evict. Hit rate = `cached_tokens` ÷ prompt tokens, as the engine "
        "reports them (ground truth, whole blocks). `kv`: a daemon that follows the workers' "
        "KV events; `approximate`: a second daemon with `router.kv_blocks_per_worker = 0` "
        "(credits what it routed); `x2`: two such daemons, each request to either at random "
        "(router replicas); `random`: each request straight to a worker picked at random. "
        "Every round runs every routing, in a new order, with new words.",
    ]


def plot(runs: list[Json], path: Path) -> None:
    """Hit rate and TTFT p50 per (engine, stack, routing), side by side."""
    summaries = [(run["engine"], s) for run in runs for s in run.get("runs") or []]
    if not summaries:
        return
    labels = [f"{s['stack']} {s['variant']}\n({engine})" for engine, s in summaries]
    summaries_only = [s for _, s in summaries]
    fig, (hits, ttft) = plt.subplots(1, 2, figsize=(12, 5))
    hits.bar(labels, [s["hit_rate"] for s in summaries_only], color="C0")
    hits.set_ylabel("hit rate (cached ÷ prompt tokens)")
    hits.set_ylim(0, 1)
    ttft.bar(labels, [s["ttft_p50_ms"] or 0 for s in summaries_only], color="C1")
    ttft.set_ylabel("time to first token, p50 (ms)")
    for axis in (hits, ttft):
        axis.tick_params(axis="x", labelsize=7, rotation=90)
    fig.suptitle("Prefix routing (bench.prefix): TTFT compares within one stack and engine")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
