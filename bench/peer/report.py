"""The peer section of ``bench/RESULTS.md`` and its plot, from ``bench.peer``'s JSON.

``bench.report --peer FILE [FILE ...]`` calls these: the last file's run is the table; the
ratios of the other runs stand beside it, so the spread between runs shows as well as the
spread between rounds of one run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; before pyplot is imported
import matplotlib.pyplot as plt
from matplotlib import ticker

from bench.common import markdown_table
from bench.peer.rows import number

TITLE = "Peer: NVIDIA Dynamo 1.6.1 (`bench.peer`)"
PLOT = "peer.png"
Json = dict[str, Any]
SERIES = (  # (target, label, style) for the latency plot
    ("dynamod", "dynamod front", "C0-"),
    ("dynamo", "Dynamo 1.6.1 frontend", "C1-"),
    ("dynamod-worker", "dynamod worker, no front (floor)", "C0:"),
    ("dynamo-worker", "Dynamo worker over its request plane (floor)", "C1:"),
)


def section(runs: list[Json], sources: list[str]) -> list[str]:
    """Markdown lines for the section body (the caller writes the ``## TITLE`` line);
    ``sources`` name the files ``runs`` were read from."""
    last, others = runs[-1], runs[:-1]
    head = ["measure", "dynamod", "Dynamo 1.6.1", "ratio", "per round", "floor: dynamod",
            "floor: Dynamo", "want"]  # fmt: skip
    head += [f"ratio, run of {run['generated'][11:16]} (load {_load(run)})" for run in others]
    rows = []
    for i, r in enumerate(last["rows"]):
        rows.append([
            f"{r['measure']} ({r['unit']})", number(r["ours"], r["unit"]),
            number(r["dynamo"], r["unit"]), _ratio(r), _rounds(r),
            number(r["floor_ours"], r["unit"]), number(r["floor_dynamo"], r["unit"]),
            {"lower": "≤ 1", "higher": "≥ 1"}.get(r["better"] or "", ""),
            *(_ratio(run["rows"][i]) for run in others),
        ])  # fmt: skip
    intro = _intro(last, sources)
    return [*intro, "", *markdown_table(head, rows), *_notes(last), ""]


def _ratio(r: Json) -> str:
    return "—" if r["ratio"] is None else f"**{r['ratio']:.2f}**"


def _rounds(r: Json) -> str:
    return "—" if r["rounds"] is None else f"{r['rounds'][0]:.2f} to {r['rounds'][1]:.2f}"


def _load(run: Json) -> str:
    """The 1-minute load average before the run: how busy the shared machine was."""
    return f"{run['machine']['load_before'][0]:.1f}"


def _intro(run: Json, sources: list[str]) -> list[str]:
    machine, config, v = run["machine"], run["config"], run["versions"]
    load = "/".join(f"{x:.1f}" for x in machine["load_before"])
    files = " ".join(f"bench/out/{name}" for name in sources)
    also = f", beside the ratios of {len(sources) - 1} other run(s)" if len(sources) > 1 else ""
    return [
        f"`{run['command']}` at {run['generated']} ({machine['cpus']} CPUs, load average "
        f"{load} before it), turned into this section by `python -m bench.report --peer "
        f"{files}`{also}. Commit {run.get('commit', 'not recorded')}, dynamod "
        f"{v['dynamod']}, ai-dynamo {v['ai-dynamo']}, etcd "
        f"{v['etcd']}, Python {machine['python']}.",
        "",
        f"One front and one mocker each, both on one etcd; the same {config['prompt_tokens']}-"
        f"token completion of {config['max_tokens']} tokens (mocker time ÷ 10^6, 64-token "
        f"blocks, on both); Dynamo's frontend in `--router-mode kv`, its one mode that honours "
        f"`required_taints`. {config['rounds']} rounds, each running every measure on every "
        "target back to back, in an order reversed every other round. Ratios are dynamod ÷ "
        "Dynamo over all rounds; *per round* is the range of the same ratio round by round.",
    ]


def _notes(run: Json) -> list[str]:
    return [
        "- Floors: dynamod's worker is sent the very same HTTP request with no front; "
        "Dynamo's worker has no HTTP route, so its floor is the pre-tokenized request sent over "
        "Dynamo's request plane by Dynamo's own runtime client (`bench/peer/direct.py`), "
        "in another process. For taint → routed, the floor is one more request requiring the "
        "taint once it routes.",
        "- Which worker served: dynamod's `x-dynamo-worker-id` header; Dynamo's "
        "`nvext.worker_id.decode_worker_id`, asked for with `nvext.extra_fields`. Every "
        "routed request was checked to land on the updated worker.",
        "- CPU per request: CPU seconds of the front (or worker) process tree during the "
        "closed-loop blocks ÷ requests answered. The load generator is one Python process "
        "(aiohttp) on the same 2 cores for both stacks.",
        "",
        f"![peer latency and ratios](plots/{PLOT})",
    ]


def plot(run: Json, path: Path) -> None:
    """Left: CDFs of sequential latency, fronts and floors. Right: each ratio, with its
    per-round range."""
    figure, (cdf, bars) = plt.subplots(1, 2, figsize=(12, 4.5))
    samples = run["raw"]["samples_ns"]["seq"]
    for target, label, style in SERIES:
        ms = sorted(x / 1e6 for r in samples[target] for x in r)
        cdf.step(ms, [(i + 1) / len(ms) for i in range(len(ms))], style, where="post", label=label)
    cdf.set_xscale("log")
    cdf.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    cdf.set_xlabel("sequential request latency (ms, log)")
    cdf.set_ylabel("fraction of requests")
    cdf.grid(True, which="both", alpha=0.3)
    cdf.legend(fontsize=7)
    _ratio_bars(bars, [r for r in run["rows"] if r["ratio"] is not None])
    figure.suptitle(f"dynamod vs NVIDIA Dynamo 1.6.1 ({run['generated'][:16]})")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _ratio_bars(axes: Any, rows: list[Json]) -> None:
    ys = list(range(len(rows)))[::-1]
    ratios = [r["ratio"] for r in rows]
    good = [
        (x <= 1) if r["better"] == "lower" else (x >= 1) for x, r in zip(ratios, rows, strict=True)
    ]
    axes.barh(ys, ratios, color=["C2" if g else "C3" for g in good], alpha=0.7)
    for y, r in zip(ys, rows, strict=True):
        if r["rounds"]:
            axes.plot(r["rounds"], [y, y], "k-", lw=1.5)
    axes.axvline(1.0, color="k", lw=0.8)
    arrow = {"lower": "↓", "higher": "↑"}
    axes.set_yticks(ys, [f"{r['measure']} ({arrow[r['better']]})" for r in rows], fontsize=7)
    axes.set_xlabel("dynamod ÷ Dynamo (green: dynamod better; line: per-round range)")
    axes.grid(True, axis="x", alpha=0.3)
