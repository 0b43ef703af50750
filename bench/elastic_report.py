"""What ``bench.elastic`` makes of its arms: a summary per arm, the goals judged on it, the
printed table, the *Elastic pools* section of ``RESULTS.md`` and ``plots/elastic.png``.

Every figure comes from the run's samples; a goal is met or not by the numbers, and is
"not measured" when an arm it compares did not run."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.common import Stats, markdown_table, render_table

if TYPE_CHECKING:
    from bench.elastic import Arm, Sample, Setup

TITLE = "Elastic pools: one SLA, three arms (`bench.elastic`)"
PLOT = "elastic.png"
PREMIUM, BATCH = "pool=premium", "pool=batch"
HEADERS = (
    "arm", "step: premium n", "TTFT p50 ms", "p99 ms", "<= SLO", "all: premium n",
    "TTFT p50 ms", "p99 ms", "<= SLO", "batch req/s", "errors", "moves", "steady moves",
    "premium workers (step)",
)  # fmt: skip


@dataclass(frozen=True)
class Summary:
    """One arm's figures (``None``: nothing to show, e.g. an arm that was refused)."""

    arm: str
    refused: str
    step_n: int
    step_ttft: Stats | None
    step_within: float | None
    all_n: int
    all_ttft: Stats | None
    all_within: float | None
    batch_per_s: float | None
    errors: int
    moves: int | None
    steady_moves: int | None
    premium_workers: tuple[int, int] | None
    """Fewest and most routable premium workers sampled during the step."""

    def cells(self) -> list[str]:
        if self.refused:
            return [self.arm, "refused"] + ["—"] * (len(HEADERS) - 2)
        workers = self.premium_workers
        return [
            self.arm, str(self.step_n), *_stats(self.step_ttft), _share(self.step_within),
            str(self.all_n), *_stats(self.all_ttft), _share(self.all_within),
            "—" if self.batch_per_s is None else f"{self.batch_per_s:.2f}", str(self.errors),
            _count(self.moves), _count(self.steady_moves),
            "—" if workers is None else f"{workers[0]}-{workers[1]}",
        ]  # fmt: skip


@dataclass(frozen=True)
class Goal:
    """One goal of issue 30, as measured: ``met`` is None when it could not be judged."""

    text: str
    measured: str
    met: bool | None

    def line(self) -> str:
        verdict = {True: "met", False: "NOT met", None: "not measured"}[self.met]
        return f"{self.text}: {self.measured}: {verdict}"


def _stats(stats: Stats | None) -> list[str]:
    return ["—", "—"] if stats is None else [f"{stats.p50_ms:.0f}", f"{stats.p99_ms:.0f}"]


def _share(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f} %"


def _count(value: int | None) -> str:
    return "—" if value is None else str(value)


def ttft_stats(samples: Sequence[Sample]) -> Stats | None:
    served = [round(s.ttft * 1e9) for s in samples if s.ttft is not None]
    return Stats.of(served) if served else None


def within(samples: Sequence[Sample], slo_s: float) -> float | None:
    """The share of ``samples`` whose first token came within ``slo_s``; a failure misses."""
    if not samples:
        return None
    return sum(s.ttft is not None and s.ttft <= slo_s for s in samples) / len(samples)


def summarize(arm: Arm, setup: Setup) -> Summary:
    if arm.refused:
        return Summary(arm.name, arm.refused, 0, None, None, 0, None, None, None, 0, None,
                       None, None)  # fmt: skip
    t = setup.trace
    premium = [s for s in arm.samples if s.kind == "premium"]
    step = [s for s in premium if t.step_start <= s.sent < t.step_end]
    batch_done = [s for s in arm.samples if s.kind == "batch" and s.outcome == "200"]
    batch_done = [s for s in batch_done if s.done <= t.end]
    pooled = arm.name != "no-pools"
    steady = [m for m in arm.moves if any(a <= m.t < b for a, b in setup.steady())]
    in_step = [z.pools.get(PREMIUM, 0) for z in arm.sizes if t.step_start <= z.t < t.step_end]
    return Summary(
        arm=arm.name,
        refused="",
        step_n=len(step),
        step_ttft=ttft_stats(step),
        step_within=within(step, setup.slo_s),
        all_n=len(premium),
        all_ttft=ttft_stats(premium),
        all_within=within(premium, setup.slo_s),
        batch_per_s=len(batch_done) / t.end,
        errors=sum(s.outcome != "200" or s.ttft is None for s in arm.samples),
        moves=len(arm.moves) if pooled else None,
        steady_moves=len(steady) if pooled else None,
        premium_workers=(min(in_step), max(in_step)) if in_step else None,
    )


def goals(summaries: Sequence[Summary]) -> list[Goal]:
    """The three goals of issue 30, each judged on this run's figures."""
    by = {s.arm: s for s in summaries if not s.refused}
    static, elastic = by.get("static"), by.get("elastic")
    out = []
    if static and elastic and static.step_within is not None and elastic.step_within is not None:
        met = elastic.step_within >= 0.99 and static.step_within < 0.90
        said = f"elastic {_share(elastic.step_within)}, static {_share(static.step_within)}"
        out.append(Goal(_SLO_GOAL, said, met))
    else:
        out.append(Goal(_SLO_GOAL, "an arm did not run", None))
    if static and elastic and static.batch_per_s and elastic.batch_per_s is not None:
        ratio = elastic.batch_per_s / static.batch_per_s
        said = f"{elastic.batch_per_s:.2f} / {static.batch_per_s:.2f} req/s = {ratio:.2f}x"
        out.append(Goal(_BATCH_GOAL, said, ratio >= 0.9))
    else:
        out.append(Goal(_BATCH_GOAL, "an arm did not run", None))
    if elastic and elastic.steady_moves is not None:
        said = f"{elastic.steady_moves} of {elastic.moves} moves while steady"
        out.append(Goal(_STEADY_GOAL, said, elastic.steady_moves == 0))
    else:
        out.append(Goal(_STEADY_GOAL, "the elastic arm did not run", None))
    return out


_SLO_GOAL = "during the step, elastic premium within the SLO >= 99 % where static < 90 %"
_BATCH_GOAL = "batch throughput over the whole trace, elastic >= 0.9x static"
_STEADY_GOAL = "no elastic move while load is steady"


def misses(arm: Arm, setup: Setup) -> str:
    """Where the step's SLO misses fall: before the arm's first move of the step (the
    pools had not followed yet) or after it."""
    t = setup.trace
    step = [s for s in arm.samples if s.kind == "premium" and t.step_start <= s.sent < t.step_end]
    missed = [s for s in step if s.ttft is None or s.ttft > setup.slo_s]
    first = min((m.t for m in arm.moves if t.step_start <= m.t < t.step_end), default=None)
    if first is None:
        return f"{arm.name}: {len(missed)} of {len(step)} step requests missed the SLO; no move"
    early = sum(s.sent < first for s in missed)
    return (
        f"{arm.name}: {len(missed)} of {len(step)} step requests missed the SLO, {early} of "
        f"them sent before the first move ({first - t.step_start:.1f} s into the step)"
    )


def timeline(arm: Arm) -> list[str]:
    """The premium pool's size each time it changed, and the moves, in words."""
    out, last = [], None
    for sizes in arm.sizes:
        now = tuple((sizes.pools.get(p, 0), sizes.want.get(p)) for p in (PREMIUM, BATCH))
        if now != last:
            shown = ", ".join(
                f"{name} {held}" + ("" if want is None else f" (wants {want}, demand "
                                    f"{sizes.demand.get(pool, 0):g})")
                for name, pool, (held, want) in zip(("premium", "batch"), (PREMIUM, BATCH), now,
                                                    strict=True)
            )  # fmt: skip
            out.append(f"t {sizes.t:6.1f} s: {shown}")
            last = now
    out += [
        f"t {m.t:6.1f} s: moved {m.worker[:8]} {m.from_pool or '(none)'} -> {m.to_pool} "
        f"(why: {m.why})"
        for m in arm.moves
    ]
    return sorted(out)


def text(summaries: Sequence[Summary], judged: Sequence[Goal], arms: Sequence[Arm],
         setup: Setup) -> str:  # fmt: skip
    lines = [render_table(HEADERS, [s.cells() for s in summaries]), ""]
    lines += [f"{s.arm}: refused: {s.refused}" for s in summaries if s.refused]
    lines += [f"goal: {g.line()}" for g in judged]
    windows = ", ".join(f"{a:g}-{b:g} s" for a, b in setup.steady())
    lines += ["", f"steady windows: {windows}; step {setup.trace.step_start:g}-"
              f"{setup.trace.step_end:g} s"]  # fmt: skip
    for arm in arms:
        if arm.name == "elastic" and not arm.refused:
            lines += ["", misses(arm, setup), "", "elastic: the pools over time", *timeline(arm)]
    return "\n".join(lines)


def section(document: dict[str, Any], arms: Sequence[Arm], setup: Setup) -> list[str]:
    """The Markdown section: the setup in words, the command, the table, the goals, the plot
    and the elastic arm's timeline."""
    t = setup.trace
    rows = [_cells(s) for s in document["summaries"]]
    out = [
        f"{setup.workers} mocker workers (`--max-num-seqs {setup.max_num_seqs}`, "
        f"`--speedup-ratio {setup.speedup:g}`: one request of {setup.max_tokens} tokens "
        "takes ~0.5 s on a free slot, its first token ~60 ms), one dynamod, etcd; a new "
        "fleet per arm. Policy `pool=premium: 34, pool=batch: 66`, `min_per_pool: 1` (2 and "
        f"4 workers); the elastic arm adds `target_in_flight: {setup.target_in_flight:g}`, "
        f"`scale_down_after: {setup.scale_down_after:g}`; *no-pools* has no policy and no "
        "required taint (both classes on every worker). Closed-loop clients: batch "
        f"{t.batch} throughout; premium {t.premium_low}, then {t.premium_step} from "
        f"{t.step_start:g} s to {t.step_end:g} s, then {t.premium_low} again until "
        f"{t.end:g} s. SLO: premium TTFT <= {setup.slo_s:g} s, just under one request's "
        "service time: a request that finds a free slot has its first token in 60-110 ms, "
        "one that waits for a request ahead of it to finish mostly misses; a failed request is a "
        "miss. *step* = premium requests sent during the step; *steady moves* = moves "
        f"made more than {setup.react_s:g} s after a rise or "
        f"{setup.scale_down_after + setup.react_s:g} s after a fall. Load average "
        f"{document['load'][0]:.1f} before the run, {document['load'][1]:.1f} after "
        f"(2 shared cores). See `bench/elastic.py`.",
        "",
        f"`{document['command']}`:",
        "",
        *markdown_table(HEADERS, rows),
        *[f"- {g['text']}: {g['measured']}: **{_verdict(g['met'])}**" for g in document["goals"]],
        "",
        f"![premium TTFT and pool sizes over time](plots/{PLOT})",
        "",
    ]
    for arm in arms:
        if arm.name == "elastic" and not arm.refused:
            out += [misses(arm, setup) + ".", "",
                    "The elastic arm's pools over time (sampled every 0.5 s) and its moves:",
                    "", "```", *timeline(arm), "```", ""]  # fmt: skip
    return out


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "not met", None: "not measured"}[met]


def _cells(summary: dict[str, Any]) -> list[str]:
    def stats(value: dict[str, Any] | None) -> Stats | None:
        return None if value is None else Stats(**value)

    workers = summary["premium_workers"]
    rebuilt = Summary(**{
        **summary,
        "step_ttft": stats(summary["step_ttft"]),
        "all_ttft": stats(summary["all_ttft"]),
        "premium_workers": None if workers is None else tuple(workers),
    })  # fmt: skip
    return rebuilt.cells()


def plot(arms: Sequence[Arm], setup: Setup, path: Path) -> None:
    """Premium TTFT per request (by send time) above, the premium pool's size below, for
    the static and elastic arms; the step shaded, the SLO drawn."""
    import matplotlib

    matplotlib.use("Agg")  # files only; before pyplot is imported
    import matplotlib.pyplot as plt

    shown = [a for a in arms if a.name in ("static", "elastic") and not a.refused]
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    t = setup.trace
    for index, arm in enumerate(shown):
        color = f"C{index}"
        served = [(s.sent, s.ttft * 1000) for s in arm.samples if s.kind == "premium" and s.ttft]
        top.scatter([x for x, _ in served], [y for _, y in served], s=4, color=color,
                    alpha=0.5, label=arm.name)  # fmt: skip
        xs = [z.t for z in arm.sizes]
        ys = [z.pools.get(PREMIUM, 0) for z in arm.sizes]
        bottom.step(xs, ys, where="post", color=color, label=f"{arm.name}: premium workers")
        wants = [(z.t, z.want[PREMIUM]) for z in arm.sizes if PREMIUM in z.want]
        if wants:
            label = f"{arm.name}: premium wants"
            bottom.step([x for x, _ in wants], [y for _, y in wants], where="post", color=color,
                        linestyle="--", linewidth=1, label=label)  # fmt: skip
    for axes in (top, bottom):
        axes.axvspan(t.step_start, t.step_end, color="0.9", zorder=0)
        axes.grid(True, alpha=0.3)
    top.axhline(setup.slo_s * 1000, color="k", linestyle="--", linewidth=1, label="SLO")
    top.set_yscale("log")
    top.set_ylabel("premium TTFT (ms, log)")
    top.set_title("Premium TTFT and the premium pool, static against elastic")
    top.legend(fontsize=8, markerscale=3)
    clients = [(x, t.premium_clients(x)) for x in (0, t.step_start, t.step_end, t.end)]
    bottom.step([c[0] for c in clients], [c[1] / setup.target_in_flight for c in clients],
                where="post", color="0.5", linestyle=":",
                label=f"premium clients ÷ {setup.target_in_flight:g}")  # fmt: skip
    bottom.set_ylabel("workers")
    bottom.set_xlabel("seconds from the trace's start (the step shaded)")
    bottom.set_ylim(0, setup.workers + 0.5)
    bottom.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_results(results: Path, document: dict[str, Any], arms: Sequence[Arm],
                  setup: Setup) -> None:  # fmt: skip
    """Splice the section into ``results`` (the rest kept) and write the plot beside it."""
    from bench.report import splice

    previous = results.read_text() if results.exists() else "# Benchmark results\n"
    results.write_text(splice(previous, TITLE, section(document, arms, setup)))
    plot(arms, setup, results.parent / "plots" / PLOT)
    print(f"wrote the elastic section of {results} and plots/{PLOT}", file=sys.stderr)
