"""The shipped dashboard and rules, read the way Grafana and Prometheus read them, and the
checks every expression must pass (a real PromQL parser: ``promql_parser``).

``dashboard_queries()``: every panel target's expression with Grafana's variables filled
in (``$job`` and ``$instance`` match everything, ``$__rate_interval`` is given);
``rule_expressions()``: every rule's; ``misuses(expr, families)``: what an expression does
wrong with the metric families a running dynamod exports (``families_of`` its
``/metrics``): a name it does not export, a counter outside ``rate()`` / ``increase()``, a
histogram's buckets outside ``histogram_quantile(..., rate(..._bucket))`` or summed
without ``le``, a gauge inside ``rate()``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser as promql
import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "packaging" / "grafana" / "dynamod.json"
RULES = ROOT / "packaging" / "prometheus" / "dynamod-rules.yaml"
RATES = {"rate", "increase", "irate"}
PROMETHEUS_OWN = {"up"}
"""Series Prometheus makes itself (the rules may use them; the dashboard uses none)."""


@dataclass(frozen=True)
class Query:
    """One expression and where it is: a panel's title and target, or a rule's name."""

    where: str
    expr: str


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def dashboard_queries(rate_interval: str = "1m") -> list[Query]:
    return [
        Query(f"panel {p['title']!r} {t['refId']}", expand(t["expr"], rate_interval))
        for p in panels()
        for t in p["targets"]
    ]


def expand(expr: str, rate_interval: str) -> str:
    """A target's expression as Grafana sends it, every job and instance chosen."""
    return (
        expr.replace("$__rate_interval", rate_interval)
        .replace("$job", ".*")
        .replace("$instance", ".*")
    )


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def rule_expressions() -> list[Query]:
    return [Query(f"rule {r.get('alert') or r['record']}", r["expr"]) for r in rules()]


def recorded() -> set[str]:
    return {r["record"] for r in rules() if "record" in r}


def families_of(metrics: str) -> dict[str, str]:
    """Each series name a ``/metrics`` page can hold, with its family's type: a counter's
    ``_total``, a histogram's ``_bucket``, ``_count`` and ``_sum``, a gauge's own name."""
    names: dict[str, str] = {}
    for match in re.finditer(r"^# TYPE (\S+) (\S+)$", metrics, re.MULTILINE):
        name, kind = match.groups()
        if kind == "counter":
            names[name if name.endswith("_total") else f"{name}_total"] = "counter"
        elif kind == "histogram":
            for suffix in ("_bucket", "_count", "_sum"):
                names[name + suffix] = "histogram" + suffix
        else:
            names[name] = kind
    return names


def selectors(expr: str) -> Iterator[tuple[promql.VectorSelector, tuple[Any, ...]]]:
    """Every vector selector of ``expr`` with the nodes above it, outermost first."""
    yield from _walk(promql.parse(expr), ())


def _walk(node: Any, above: tuple[Any, ...]) -> Iterator[tuple[Any, tuple[Any, ...]]]:
    if isinstance(node, promql.VectorSelector):
        yield node, above
        return
    here = (*above, node)
    if isinstance(node, promql.MatrixSelector):
        yield from _walk(node.vector_selector, here)
    elif isinstance(node, promql.Call):
        for arg in node.args:
            yield from _walk(arg, here)
    elif isinstance(node, promql.BinaryExpr):
        yield from _walk(node.lhs, here)
        yield from _walk(node.rhs, here)
    elif isinstance(node, (promql.AggregateExpr, promql.ParenExpr, promql.UnaryExpr,
                           promql.SubqueryExpr)):  # fmt: skip
        yield from _walk(node.expr, here)


def misuses(query: Query, families: dict[str, str], allowed: Collection[str] = ()) -> list[str]:
    """What ``query`` does wrong (see the module docstring); ``allowed``: names defined
    elsewhere (recording rules, Prometheus's own)."""
    found = []
    for selector, above in selectors(query.expr):
        name = selector.name or ""
        if name in allowed:
            continue
        kind = families.get(name)
        if kind is None:
            found.append(f"{query.where}: {name} is not on dynamod's /metrics")
        elif problem := _misuse(name, kind, above):
            found.append(f"{query.where}: {problem}")
    return found


def _misuse(name: str, kind: str, above: tuple[Any, ...]) -> str | None:
    rated = (
        len(above) >= 2
        and isinstance(above[-1], promql.MatrixSelector)
        and _call(above[-2]) in RATES
    )
    if kind in ("counter", "histogram_count", "histogram_sum") and not rated:
        return f"{name} is a counter: only inside rate() or increase()"
    if kind == "histogram_bucket":
        if not rated or "histogram_quantile" not in {_call(n) for n in above}:
            return f"{name}: a histogram's buckets only as histogram_quantile(q, rate(...))"
        sums = [n for n in above if isinstance(n, promql.AggregateExpr)]
        if any("le" not in _grouping(n) for n in sums):
            return f"{name}: every sum over its buckets keeps le"
    if kind in ("gauge", "untyped") and any(_call(n) in RATES for n in above):
        return f"{name} is a gauge: never inside rate() or increase()"
    return None


def _call(node: Any) -> str | None:
    return node.func.name if isinstance(node, promql.Call) else None


def _grouping(node: Any) -> set[str]:
    """The labels an aggregation keeps (``by``); all for ``without`` or none given."""
    text = str(node)
    match = re.match(r"\w+ by \(([^)]*)\)", text)
    if match:
        return {label.strip() for label in match.group(1).split(",")}
    return {"le"} if " without " in text.split("(")[0] else set()
