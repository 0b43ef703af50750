"""Run the benchmarks and the chaos scenarios, and write ``bench/RESULTS.md`` and its plots.

    python -m bench.report              # everything, ~6 minutes on 2 cores (+ ~15 exit drain)
    python -m bench.report --quick      # smaller sizes, no chaos run (a smoke test)
    python -m bench.report --only exit_drain   # one benchmark: its section, the rest kept
    python -m bench.report --peer F...  # only the peer section, from bench.peer's JSON
    python -m bench.report --prefix F.. # only the prefix-routing section, from bench.prefix's JSON
    python -m bench.report --pools T... # only the pools section, from bench.pools(_plan)'s output

Each benchmark runs as its own process with modest sizes and ``--json``; the report is
built from those files only (``bench.route`` has no JSON: its table is quoted as printed).
The chaos scenarios run under pytest (``tests/chaos``): pass or fail from the JUnit XML,
measured figures from the file their ``figures`` fixture writes. Every number in
``RESULTS.md`` comes from this run, beside the floor or baseline measured in the same run;
nothing is typed by hand. Plots use matplotlib's Agg backend.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; before pyplot is imported
import matplotlib.pyplot as plt
from matplotlib import ticker

from bench import elastic_report, pools_report
from bench.common import markdown_table as table
from bench.peer import report as peer_report
from bench.prefix import report as prefix_report
from bench.sections import SECTIONS, p

BENCH = Path(__file__).resolve().parent
DYNAMO_FLEETS = "Dynamo fleets (`bench.dynamo_fleet`)"
"""The section ``python -m bench.dynamo_fleet --results`` writes (kept here, as the peer's)."""
ROOT = BENCH.parent
Json = dict[str, Any]


@dataclass(frozen=True)
class Suite:
    """One benchmark run: ``python -m <module> <args> --json FILE``."""

    name: str
    module: str
    args: tuple[str, ...] = ()
    quick_args: tuple[str, ...] = ()
    json: bool = True


SUITES = (
    Suite("store_latency", "bench.store_latency", ("--ops", "300"), ("--ops", "60")),
    Suite("propagation", "bench.propagation", ("--updates", "300"), ("--updates", "60")),
    Suite("front", "bench.front", ("--requests", "300"), ("--requests", "60")),
    Suite(
        "front_profile",
        "bench.front_profile",
        ("--requests", "300", "--streams", "100"),
        ("--requests", "60", "--streams", "20"),
    ),
    Suite("cli", "bench.ctl_commands", ("--runs", "10"), ("--runs", "3")),
    Suite("scale", "bench.scale", (), ("--workers", "1000", "--requests", "50")),
    Suite("load", "bench.load", ("--duration", "10"), ("--duration", "4")),
    Suite("route", "bench.route", ("--quick",), ("--quick", "--rounds", "50"), json=False),
    Suite("exit_drain", "bench.exit_drain", (), ("--runs", "20", "--blocking-runs", "5")),
    Suite("engines", "bench.engines", (), ("--requests", "50", "--onsets", "10")),
    Suite("hostile", "bench.hostile", ("--requests", "300"), ("--requests", "30")),
    Suite("template_cost", "bench.template_cost", ("--requests", "500"), ("--requests", "50")),
)


@dataclass
class Ran:
    """What one suite left: its JSON (or printed table), or why it failed."""

    suite: Suite
    data: Json | None = None
    stdout: str = ""
    error: str = ""
    seconds: float = 0.0
    missing: bool = False  # the benchmark is not written yet: reported, not a failure


def run_suite(suite: Suite, work: Path, quick: bool) -> Ran:
    if not (BENCH / f"{suite.module.rpartition('.')[2]}.py").exists():
        return Ran(suite, error=f"{suite.module} does not exist yet", missing=True)
    out = work / f"{suite.name}.json"
    argv = [sys.executable, "-m", suite.module, *(suite.quick_args if quick else suite.args)]
    argv += ["--json", str(out)] if suite.json else []
    print(f"running {' '.join(argv[2:])}", file=sys.stderr, flush=True)
    started = datetime.datetime.now()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    seconds = (datetime.datetime.now() - started).total_seconds()
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        return Ran(suite, stdout=done.stdout, error=f"exit {done.returncode}: {tail}")
    data = json.loads(out.read_text()) if suite.json else None
    return Ran(suite, data=data, stdout=done.stdout, seconds=seconds)


# -- chaos scenarios -------------------------------------------------------------------------


@dataclass
class Scenario:
    module: str
    name: str
    outcome: str
    seconds: float
    figures: Json = field(default_factory=dict)


def run_chaos(work: Path) -> list[Scenario]:
    junit, figures = work / "chaos.xml", work / "chaos-figures.jsonl"
    argv = [
        sys.executable, "-m", "pytest", "tests/chaos", "-q", "-p", "no:cacheprovider",
        f"--junitxml={junit}",
    ]  # fmt: skip
    print("running pytest tests/chaos", file=sys.stderr, flush=True)
    env = {**os.environ, "DYNAMO_CHAOS_FIGURES": str(figures)}
    subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, check=False)
    found = {}
    if figures.exists():
        for line in figures.read_text().splitlines():
            entry = json.loads(line)
            found[entry["test"].rpartition("::")[2]] = entry["figures"]
    return [_scenario(case, found) for case in ElementTree.parse(junit).iter("testcase")]


def _scenario(case: ElementTree.Element, figures: dict[str, Json]) -> Scenario:
    name = case.get("name", "?")
    module = case.get("classname", "").rpartition(".")[2]
    seconds = float(case.get("time", 0))
    return Scenario(module, name, _outcome(case), seconds, figures.get(name, {}))


def _outcome(case: ElementTree.Element) -> str:
    for tag, said in (("failure", "FAIL"), ("error", "ERROR"), ("skipped", "skipped")):
        element = case.find(tag)
        if element is not None:
            message = (element.get("message") or "").splitlines()
            return f"{said}: {message[0][:140]}" if message else said
    return "pass"


# -- markdown ------------------------------------------------------------------------------


ORACLE = "test_judge"  # the oracle's own tests: not scenarios, summed up in one line


def section_chaos(scenarios: list[Scenario]) -> list[str]:
    real = [s for s in scenarios if s.module != ORACLE]
    rows = [
        [s.name.removeprefix("test_").replace("_", " "), s.outcome, f"{s.seconds:.0f}",
         "; ".join(f"{k}: {v}" for k, v in s.figures.items()) or "—"]
        for s in real
    ]  # fmt: skip
    passed = sum(s.outcome == "pass" for s in real)
    oracle = [s for s in scenarios if s.module == ORACLE]
    checked = sum(s.outcome == "pass" for s in oracle)
    return [
        f"{passed} of {len(real)} scenarios passed (`pytest tests/chaos`). The judge they "
        f"share (`bench.load`) passed {checked} of {len(oracle)} of its own tests "
        f"(`tests/chaos/{ORACLE}.py`).",
        "",
        *table(("scenario", "outcome", "s", "measured"), rows),
    ]


# -- plots ---------------------------------------------------------------------------------


def plot_propagation(scale: Json, path: Path) -> None:
    """CDF of propagation through dynamod, per backend, at the largest and the baseline."""
    figure, axes = plt.subplots(figsize=(7, 4))
    sizes = scale["sizes"]
    backends = sorted({r["backend"] for r in scale["rows"]})
    for row in scale["rows"]:
        if row["workers"] not in (sizes[0], sizes[-1]):
            continue
        samples = sorted(row["propagation_ms"])
        ys = [(i + 1) / len(samples) for i in range(len(samples))]
        style = "-" if row["workers"] == sizes[-1] else "--"
        color = f"C{backends.index(row['backend'])}"
        label = f"{row['backend']}, {row['workers']:,} workers"
        axes.step(samples, ys, style, color=color, where="post", label=label)
    axes.set_xscale("log")
    axes.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    axes.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    axes.xaxis.set_minor_formatter(ticker.NullFormatter())
    axes.set_xlabel("update_taints returned → event on dynamod's stream (ms, log)")
    axes.set_ylabel("fraction of updates")
    axes.set_title("Taint propagation through dynamod")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_routing(scale: Json, path: Path) -> None:
    """Request p50 and the daemon's mean decision time against fleet size."""
    figure, axes = plt.subplots(figsize=(7, 4))
    for backend in sorted({r["backend"] for r in scale["rows"]}):
        rows = [r for r in scale["rows"] if r["backend"] == backend]
        xs = [r["workers"] for r in rows]
        axes.plot(xs, [r["request"]["all"]["p50_ms"] for r in rows], "o-",
                  label=f"{backend}: request p50, all eligible")  # fmt: skip
        for share, style in (("all", "s--"), ("1/20", "^:")):
            shown = [r for r in rows if share in r["decision_mean_us"]]
            decisions = [r["decision_mean_us"][share] / 1000 for r in shown]
            axes.plot([r["workers"] for r in shown], decisions, style,
                      label=f"{backend}: decision, {share} eligible")  # fmt: skip
    axes.set_xscale("log")
    axes.set_yscale("log")
    for axis in (axes.xaxis, axes.yaxis):
        axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,g}"))
    axes.set_xlabel("registered workers (log)")
    axes.set_ylabel("ms (log)")
    axes.set_title("Routing against fleet size")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


# -- the document --------------------------------------------------------------------------


def headline(runs: dict[str, Ran], chaos: list[Scenario] | None) -> list[str]:
    rows: list[list[str]] = []
    scale = runs["scale"].data
    if scale:
        for backend in sorted({r["backend"] for r in scale["rows"]}):
            mine = [r for r in scale["rows"] if r["backend"] == backend]
            small, big = mine[0], mine[-1]
            n, b = f"{big['workers']:,}", f"{small['workers']:,}"
            rows += [
                [f"{backend}: propagation p50 / p99 at {n} workers",
                 f"{p(big['propagation'])} / {p(big['propagation'], 'p99_ms')} ms",
                 f"{p(small['propagation'])} / {p(small['propagation'], 'p99_ms')} ms at {b}"],
                [f"{backend}: dynamod start → ready at {n}", f"{big['ready_s']:.2f} s",
                 f"{small['ready_s']:.2f} s at {b}; store list {p(big['list_floor'])} ms"],
                [f"{backend}: daemon RSS at {n}", f"{big['rss_mb']:.0f} MB",
                 f"{small['rss_mb']:.0f} MB at {b}"],
                [f"{backend}: ListWorkers at {n}", f"{p(big['list_workers'])} ms"
                 + (" (raw channel: the client refuses it)"
                    if big["list_workers_raw_channel"] else ""),
                 f"{p(small['list_workers'])} ms at {b}"],
                [f"{backend}: routing decision at {n} (all eligible)",
                 f"{big['decision_mean_us']['all']:.0f} µs",
                 f"{small['decision_mean_us']['all']:.0f} µs at {b}"],
                [f"{backend}: request through the front at {n} (all eligible)",
                 f"{p(big['request']['all'])} ms",
                 f"{p(small['request']['all'])} ms at {b}"],
            ]  # fmt: skip
    load = runs["load"].data
    if load:
        flipping = load["phases"][-1]
        bad = sum(flipping["verdicts"].get(v, 0) for v in ("violated", "refused, unjustified"))
        rows.append(
            ["load: requests routed against their constraints while flipping",
             f"{bad} of {flipping['sent']}", f"{flipping['flips_ok']} pool moves"]
        )  # fmt: skip
    if chaos is not None:
        real = [s for s in chaos if s.module != ORACLE]
        passed = sum(s.outcome == "pass" for s in real)
        rows.append(["chaos scenarios passed", f"{passed} of {len(real)}", "—"])
    return table(("figure", "value", "baseline / floor (same run)"), rows)


def document(runs: dict[str, Ran], chaos: list[Scenario] | None, quick: bool) -> str:
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    out = [
        "# Benchmark results",
        "",
        f"Generated by `python -m bench.report{' --quick' if quick else ''}` on {when}: "
        f"Python {platform.python_version()}, {platform.machine()}, {cpus} CPUs. "
        "Every figure below comes from this run; do not edit by hand.",
        "",
        "## Headline",
        "",
        *headline(runs, chaos),
    ]
    for name, (title, render) in SECTIONS.items():
        ran = runs[name]
        out += [f"## {title}", ""]
        out += render(ran.data) if ran.data else [f"Not measured: {ran.error}", ""]
    route = runs["route"]
    out += ["## Routing decision, in process (`bench.route`)", ""]
    out += ["```", route.stdout.rstrip(), "```", ""] if not route.error else [route.error, ""]
    out += ["## Chaos scenarios (`tests/chaos`)", ""]
    out += section_chaos(chaos) if chaos is not None else ["Not run (`--quick`).", ""]
    return "\n".join(out).rstrip() + "\n"


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, no chaos run")
    parser.add_argument("--out", type=Path, default=BENCH / "RESULTS.md")
    parser.add_argument(
        "--peer",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="run nothing: (re)write only the peer section of --out and its plot from these "
        "`python -m bench.peer` results (the last one is the table)",
    )
    parser.add_argument(
        "--prefix",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="run nothing: (re)write only the prefix-routing section of --out and its plot "
        "from these `python -m bench.prefix` results (one part each)",
    )
    parser.add_argument(
        "--pools",
        type=Path,
        nargs="+",
        metavar="TXT",
        help="run nothing: (re)write only the Pools section of --out from the saved output "
        "of `python -m bench.pools` and `python -m bench.pools_plan`",
    )
    parser.add_argument(
        "--only", choices=sorted(SECTIONS), help="run one benchmark; rewrite only its section"
    )
    return parser.parse_args(argv)


# -- the peer section: written from bench.peer's JSON, kept as it is by a full run ---------


def section_bounds(lines: list[str], title: str) -> tuple[int, int] | None:
    """Where the section ``## title`` starts and ends (the next ``## `` line, or the end)."""
    heading = f"## {title}"
    if heading not in lines:
        return None
    start = lines.index(heading)
    ends = [i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")]
    return start, ends[0] if ends else len(lines)


def splice(text: str, title: str, body: list[str]) -> str:
    """``text`` with the section ``title`` replaced by ``body``, or added at the end."""
    lines = text.rstrip("\n").split("\n")
    section = [f"## {title}", "", *body]
    found = section_bounds(lines, title)
    start, end = found if found else (len(lines), len(lines))
    lines[start:end] = ([""] if not found else []) + section
    return "\n".join(lines).rstrip("\n") + "\n"


def kept_section(previous: str, title: str) -> list[str] | None:
    """The body of the section ``title`` in ``previous``, if it has one."""
    lines = previous.rstrip("\n").split("\n")
    found = section_bounds(lines, title)
    return None if found is None else lines[found[0] + 2 : found[1]]


def write_peer(files: list[Path], out: Path) -> int:
    runs = [json.loads(f.read_text()) for f in files]
    previous = out.read_text() if out.exists() else "# Benchmark results\n"
    body = peer_report.section(runs, [f.name for f in files])
    out.write_text(splice(previous, peer_report.TITLE, body))
    peer_report.plot(runs[-1], out.parent / "plots" / peer_report.PLOT)
    print(f"wrote the peer section of {out} and plots/{peer_report.PLOT}", file=sys.stderr)
    return 0


def write_prefix(files: list[Path], out: Path) -> int:
    runs = [json.loads(f.read_text()) for f in files]
    previous = out.read_text() if out.exists() else "# Benchmark results\n"
    body = prefix_report.section(runs, [f.name for f in files])
    out.write_text(splice(previous, prefix_report.TITLE, body))
    prefix_report.plot(runs, out.parent / "plots" / prefix_report.PLOT)
    print(f"wrote the prefix section of {out} and plots/{prefix_report.PLOT}", file=sys.stderr)
    return 0


def write_pools(files: list[Path], out: Path) -> int:
    previous = out.read_text() if out.exists() else "# Benchmark results\n"
    out.write_text(splice(previous, pools_report.TITLE, pools_report.section(files)))
    print(f"wrote the pools section of {out}", file=sys.stderr)
    return 0


def only(name: str, out: Path, quick: bool) -> int:
    """Run the one benchmark ``name`` and rewrite its section of ``out``; the others stay."""
    with tempfile.TemporaryDirectory(prefix="dynamod-report-") as scratch:
        ran = run_suite(next(s for s in SUITES if s.name == name), Path(scratch), quick)
    if ran.data is None:
        print(f"not passed: {name}: {ran.error}", file=sys.stderr)
        return 1
    title, render = SECTIONS[name]
    out.write_text(splice(out.read_text(), title, render(ran.data)))
    print(f"rewrote the {title!r} section of {out}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    plots = args.out.parent / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    if args.peer:
        return write_peer(args.peer, args.out)
    if args.only:
        return only(args.only, args.out, args.quick)
    if args.prefix:
        return write_prefix(args.prefix, args.out)
    if args.pools:
        return write_pools(args.pools, args.out)
    previous = args.out.read_text() if args.out.exists() else ""
    with tempfile.TemporaryDirectory(prefix="dynamod-report-") as scratch:
        work = Path(scratch)
        runs = {s.name: run_suite(s, work, args.quick) for s in SUITES}
        chaos = None if args.quick else run_chaos(work)
    scale = runs["scale"].data
    if scale:
        plot_propagation(scale, plots / "propagation_cdf.png")
        plot_routing(scale, plots / "routing_vs_fleet.png")
    text = document(runs, chaos, args.quick)
    # None of these is rerun here: their sections are kept as they are.
    kept_titles = (
        peer_report.TITLE, prefix_report.TITLE, pools_report.TITLE, elastic_report.TITLE,
        DYNAMO_FLEETS,
    )  # fmt: skip
    for title in kept_titles:
        kept = kept_section(previous, title)
        text = text if kept is None else splice(text, title, kept)
    args.out.write_text(text)
    print(f"wrote {args.out} and {plots}/", file=sys.stderr)
    failed = [r.suite.name for r in runs.values() if r.error and not r.missing]
    failed += [s.name for s in chaos or () if s.outcome != "pass"]
    for name in failed:
        print(f"not passed: {name}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
