"""The Grafana dashboard and the Prometheus rules, checked against a running dynamod: each
expression parsed by a real PromQL parser, every metric it names on the daemon's
``/metrics``, counters only through ``rate()`` / ``increase()``, histograms only through
``histogram_quantile`` over ``_bucket``; the dashboard importable (its variables, its
rows, at least 12 panels); each alert with a summary and a runbook section."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator

import pytest

from tests.observe import promql
from tests.support.processes import Spawned, daemon_argv

ROWS = ("Front", "Routing", "Discovery", "Pools", "KV cache")
ALERTS = {
    "DynamodNoPoolLeader", "DynamodPoolBelowTarget", "DynamodWorkersMarked", "DynamodStoreErrors",
    "DynamodRouterQueueWaitHigh", "DynamodDown", "DynamodTaintPropagationSlow",
}  # fmt: skip
GUIDE = promql.ROOT / "docs" / "operator-guide.md"


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The series a real dynamod (no worker, no policy) shows on its /metrics."""
    root = tmp_path_factory.mktemp("metrics")
    argv = daemon_argv("memory://", root / "d.sock")
    daemon = Spawned(argv, r"^dynamod ready:", root / "dynamod.log").wait_ready()
    try:
        with urllib.request.urlopen(f"{daemon.field('http')}/metrics", timeout=10) as page:
            yield promql.families_of(page.read().decode())
    finally:
        daemon.finish()


def test_the_dashboard_is_importable_with_its_variables_and_rows() -> None:
    board = promql.dashboard()
    assert board["uid"] == "dynamod" and board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("job", "instance"):
        assert variables[name]["type"] == "query" and variables[name]["includeAll"]
        assert variables[name]["datasource"]["uid"] == "${datasource}"
        inner = variables[name]["query"]["query"].removeprefix("label_values(")
        [(selector, _)] = promql.selectors(promql.expand(inner.rsplit(",", 1)[0], "1m"))
        assert selector.name == "dynamod_view_revision"
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert tuple(rows) == ROWS
    panels = promql.panels()
    assert len(panels) >= 12
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    for panel in panels:
        where = panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", where
        assert panel["targets"] and panel["description"], where
        position = panel["gridPos"]
        assert position["x"] + position["w"] <= 24, where


def test_every_dashboard_query_selects_by_job_and_instance() -> None:
    """Each selector of each panel honours the two variables, so one daemon can be shown."""
    for panel in promql.panels():
        for target in panel["targets"]:
            for selector, _ in promql.selectors(promql.expand(target["expr"], "1m")):
                matchers = {m.name for m in selector.matchers.matchers}
                assert {"job", "instance"} <= matchers, (panel["title"], str(selector))
            assert "$job" in target["expr"] and "$instance" in target["expr"]


def test_every_dashboard_query_uses_only_exported_metrics_rightly(families: dict[str, str]) -> None:
    wrong = [m for q in promql.dashboard_queries() for m in promql.misuses(q, families)]
    assert not wrong, "\n".join(wrong)


def test_every_rule_uses_only_exported_metrics_rightly(families: dict[str, str]) -> None:
    allowed = promql.recorded() | promql.PROMETHEUS_OWN
    wrong = [m for q in promql.rule_expressions() for m in promql.misuses(q, families, allowed)]
    assert not wrong, "\n".join(wrong)


def test_the_checks_catch_what_they_are_for(families: dict[str, str]) -> None:
    """A counter read raw, a gauge rated, buckets summed without le, a name nobody
    exports: each is caught (so the checks above can fail)."""
    bad = {
        "dynamod_front_requests_total": "is a counter",
        "rate(dynamod_view_revision[5m])": "is a gauge",
        "histogram_quantile(0.9, sum(rate(dynamod_kv_event_lag_seconds_bucket[5m])))": "keeps le",
        "dynamod_front_first_byte_seconds_bucket": "histogram_quantile",
        "rate(dynamod_no_such_thing_total[5m])": "not on dynamod's /metrics",
    }  # fmt: skip
    for expr, problem in bad.items():
        found = promql.misuses(promql.Query("probe", expr), families)
        assert len(found) == 1 and problem in found[0], (expr, found)


def test_each_alert_has_a_summary_and_a_runbook_section() -> None:
    alerts = {r["alert"]: r for r in promql.rules() if "alert" in r}
    assert set(alerts) == ALERTS
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", GUIDE.read_text(), re.MULTILINE)}
    for name, rule in alerts.items():
        annotations = rule["annotations"]
        assert annotations["summary"], name
        page, _, anchor = annotations["runbook_url"].partition("#")
        assert page == "docs/operator-guide.md" and anchor == name.lower(), name
        assert anchor in anchors, f"{name}: no section {anchor!r} in {GUIDE.name}"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_runbook_names_each_alert_once() -> None:
    text = GUIDE.read_text()
    for name in ALERTS:
        assert len(re.findall(rf"^#+ {name}$", text, re.MULTILINE)) == 1, name
