"""A real Prometheus (Debian's ``prometheus`` and ``promtool``) scraping a real fleet under
load: two dynamod daemons on one file store, mocker workers (two in an elastic pool policy, one
cordoned, one reading requests otherwise than the rest), a worker whose record stayed
after it died (unreachable: retries, failures; at the daemons' taint limit: a move the
leader cannot make), a hostile worker breaking the events boundary, requests that wait
in vain, a pool taint changed behind the leader's back.

Against it: ``promtool check rules`` and the rules' unit tests pass; every dashboard query
returns data; the marked-worker alert fires; the pool leader is killed and the no-leader
alert fires before the other daemon's campaign can win (the lease TTL, 60 s here).

Kept short: a 1 s scrape and evaluation interval, and a copy of the rules whose every
``for`` is 2 s (``for`` itself is tested at its real length by ``rules_test.yaml``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http.client
import json
import math
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dynamod.discovery.registration import new_instance_id, register
from dynamod.records import WORKERS_PREFIX, RuntimeConfig, WorkerRecord
from dynamod.store import open_store
from tests.observe import promql
from tests.observe.fleet import MODEL, Fleet, tool
from tests.support.eventually import eventually_blocking
from tests.support.processes import Spawned, started
from tests.support.servers import ServerProcess, free_port

pytestmark = pytest.mark.timeout(600)

LEASE_TTL = 60
"""The pool leader's lease in this fleet: no failover can hide the no-leader alert."""
POLICY = (
    "name: split\nselector: role=pooled\npools:\n  pool=a: 1\n  pool=b: 1\n"
    "elastic:\n  target_in_flight: 1000\n"
)
"""Elastic, so the dashboard's elastic panel has data; a target no load here reaches, so
demand never moves a worker (the drift below is the only change of a pool taint)."""
RATE_INTERVAL = "1m"
"""``$__rate_interval`` for the dashboard's queries: the whole of the load, at 1 s scrapes."""
SETTINGS = {"DYNAMO_POOL_LEASE_TTL": str(LEASE_TTL), "DYNAMO_MAX_TAINTS": "3"}


class Prometheus(ServerProcess):
    """A Prometheus on a free loopback port, scraping ``targets`` every second."""

    name = "prometheus"

    def __init__(self, workdir: Path, binary: str, targets: list[str], rules: Path) -> None:
        super().__init__(workdir)
        self.binary = binary
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "dynamod", "static_configs": [{"targets": targets}]}],
        }
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        return [
            self.binary, f"--config.file={self.config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]  # fmt: skip

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def api(self, path: str, **query: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url, timeout=10) as answer:
            reply = json.loads(answer.read())
        assert reply["status"] == "success", reply
        return reply["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def firing(self, alert: str) -> list[dict[str, Any]]:
        alerts = self.api("alerts")["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == alert and a["state"] == "firing"]


def quick_rules(path: Path) -> Path:
    """The shipped rules with every ``for`` at 2 s."""
    groups = yaml.safe_load(promql.RULES.read_text())
    for group in groups["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "2s"
    path.write_text(yaml.safe_dump(groups))
    return path


class Load:
    """Requests to every daemon's front from a thread, until ``stop()``: small ones, each
    with a prompt of its own, half of them streams, and now and then one that requires a
    taint no worker has and waits 0.3 s in vain. Bounded: at most ten minutes."""

    def __init__(self, fronts: list[str]) -> None:
        self.fronts = fronts
        self.done = threading.Event()
        self.answers: dict[int, int] = {}
        self.thread = threading.Thread(target=self._run, name="load", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        end = time.monotonic() + 600
        count = 0
        while not self.done.is_set() and time.monotonic() < end:
            count += 1
            # A prompt of its own, over a KV block: every request stores blocks (KV events).
            prompt = f"request {count} " + "hi " * 100
            body: dict[str, Any] = {"model": MODEL, "prompt": prompt, "max_tokens": 8,
                                    "stream": count % 2 == 0}  # fmt: skip
            if count % 10 == 0:
                required = {"required_taints": ["nobody/has"]}
                body["nvext"] = {"max_wait": 0.3, "routing_constraints": required}
            self._send(self.fronts[count % len(self.fronts)], body)

    def _send(self, front: str, body: dict[str, Any]) -> None:
        url = urllib.parse.urlsplit(front)
        connection = http.client.HTTPConnection(url.hostname or "", url.port, timeout=30)
        try:
            connection.request("POST", "/v1/completions", json.dumps(body),
                               {"content-type": "application/json"})  # fmt: skip
            answer = connection.getresponse()
            answer.read()
            self.answers[answer.status] = self.answers.get(answer.status, 0) + 1
        except OSError:
            self.answers[0] = self.answers.get(0, 0) + 1  # a front that was just killed
            time.sleep(0.1)
        finally:
            connection.close()

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=60)


class Churn:
    """A taint added to and removed from ``worker`` through each daemon in turn, every
    2 s, until ``stop()``: every daemon keeps measuring taint propagation, so the
    propagation panels have samples in any window of the load, however late a test
    looks (the fixture's own changes age out of a 1m rate). Bounded: ten minutes."""

    def __init__(self, fleet: Fleet, daemons: list[Spawned], worker: str) -> None:
        self.fleet, self.daemons, self.worker = fleet, daemons, worker
        self.done = threading.Event()
        self.failures = 0
        self.thread = threading.Thread(target=self._run, name="churn", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        end = time.monotonic() + 600
        count = 0
        while not self.done.wait(2.0) and time.monotonic() < end:
            daemon = self.daemons[count % len(self.daemons)]
            verb = "add" if count % 2 == 0 else "rm"
            count += 1
            done = self.fleet.ctl(daemon, "taints", verb, self.worker, "x/churn", check=False)
            self.failures += done.returncode != 0  # a daemon that was just killed

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=90)


@dataclass
class Scraped:
    fleet: Fleet
    daemons: dict[str, Spawned]
    prometheus: Prometheus
    load: Load


def register_stale(store: str, like: str) -> str:
    """A record whose worker died, a copy of the worker ``like``'s (its card: read as the
    others): nothing listens at its address, no events stream, and it holds as many
    taints as the daemons allow (the pool leader cannot add one). Its id."""

    async def write() -> str:
        async with await open_store(store) as opened:
            entries, _ = await opened.list(WORKERS_PREFIX)
            [live] = [WorkerRecord.from_bytes(e.value) for e in entries
                      if e.key.endswith("/" + like)]  # fmt: skip
            taints = RuntimeConfig(taints=("role=pooled", "x/one", "x/two"))
            record = dataclasses.replace(
                live, instance_id=new_instance_id(), address="http://127.0.0.1:9",
                system_address="", extra={}, runtime_config=taints,
            )  # fmt: skip
            await register(opened, record, await opened.grant(3600))
            return record.instance_id

    return asyncio.run(write())


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    binary = tool("prometheus")
    root = tmp_path_factory.mktemp("scraped")
    fleet = Fleet(root, (root / "store").as_uri())
    with contextlib.ExitStack() as stack:
        stack.callback(fleet.stop)
        daemons = {name: fleet.daemon(name, settings=SETTINGS) for name in ("d1", "d2")}
        d1 = daemons["d1"]
        pooled_a, _, plain, odd = fleet.start_workers(
            ("--taint", "role=pooled"), ("--taint", "role=pooled"), ("--taint", "role=plain"),
            ("--block-size", "32"),  # reads requests otherwise: left out, and counted
        )  # fmt: skip
        register_stale(fleet.store, plain)
        hostile = started(_hostile_argv(fleet.store), r"^hostile ready:", root / "hostile.log")
        stack.callback(hostile.finish)
        targets = [urllib.parse.urlsplit(d.field("http")).netloc for d in daemons.values()]
        prometheus = Prometheus(root / "prometheus", binary, targets, quick_rules(root / "r.yaml"))
        prometheus.start()
        stack.callback(prometheus.stop)
        load = Load([d.field("http") for d in daemons.values()])
        stack.callback(load.stop)
        churn = Churn(fleet, list(daemons.values()), odd)
        stack.callback(churn.stop)
        (root / "split.yaml").write_text(POLICY)
        fleet.ctl(d1, "pools", "apply", "-f", str(root / "split.yaml"))
        fleet.ctl(d1, "workers", "cordon", plain)
        eventually_blocking(
            lambda: _pool_of(fleet, d1, pooled_a), what="the leader's move of a pooled worker"
        )
        held = _pool_of(fleet, d1, pooled_a)
        fleet.ctl(d1, "taints", "add", pooled_a, "pool=b" if held == "pool=a" else "pool=a")
        yield Scraped(fleet, daemons, prometheus, load)
        assert load.answers.get(200, 0) > 0, load.answers


def _hostile_argv(store: str) -> list[str]:
    """A worker whose events stream sends a 2 MiB line (``tests/hostile_workers``)."""
    return [sys.executable, "-m", "tests.hostile_workers.events_fakes", "long_line",
            "--store", store]  # fmt: skip


def _pool_of(fleet: Fleet, daemon: Spawned, worker: str) -> str | None:
    taints = json.loads(fleet.ctl(daemon, "workers", "get", worker, "-o", "json").stdout)["taints"]
    pools = [t for t in taints if t in ("pool=a", "pool=b")]
    return pools[0] if len(pools) == 1 else None


def test_promtool_passes_the_rules_and_their_unit_tests() -> None:
    promtool = tool("promtool")
    checked = subprocess.run([promtool, "check", "rules", str(promql.RULES)],
                             capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 12 rules found" in checked.stdout
    tests = Path(__file__).with_name("rules_test.yaml")
    tested = subprocess.run([promtool, "test", "rules", str(tests)], capture_output=True,
                            text=True, timeout=120, check=False)  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_dashboard_query_returns_data(scraped: Scraped) -> None:
    """Each panel's query, as Grafana would send it with every job and instance chosen,
    returns at least one series with a number (a sampled signal: the fleet keeps busy
    until each is seen)."""
    prometheus = scraped.prometheus
    missing = {q.where: q.expr for q in promql.dashboard_queries(RATE_INTERVAL)}

    def answered() -> bool:
        for where, expr in list(missing.items()):
            if any(_number(series) for series in prometheus.query(expr)):
                del missing[where]
        return not missing

    try:
        eventually_blocking(answered, within=180, every=1.0, what="every dashboard query")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; without data:\n{json.dumps(missing, indent=1)}") from None


def _number(series: dict[str, Any]) -> bool:
    return math.isfinite(float(series["value"][1]))


def test_the_marked_worker_alert_fires(scraped: Scraped) -> None:
    alerts = eventually_blocking(
        lambda: scraped.prometheus.firing("DynamodWorkersMarked"),
        within=120, every=1.0, what="DynamodWorkersMarked firing",
    )  # fmt: skip
    assert {a["labels"]["instance"] for a in alerts} <= {
        urllib.parse.urlsplit(d.field("http")).netloc for d in scraped.daemons.values()
    }
    assert "marked unhealthy" in alerts[0]["annotations"]["summary"]


def test_the_no_leader_alert_fires_when_the_leader_is_killed(scraped: Scraped) -> None:
    """Last: the leader is killed (SIGKILL, its lease left to expire); the other daemon
    cannot lead for ``LEASE_TTL`` seconds, and the alert fires in that window."""
    prometheus = scraped.prometheus
    leading = eventually_blocking(
        lambda: prometheus.query("dynamod_pool_leader == 1"), within=60, every=1.0,
        what="a pool leader on Prometheus",
    )  # fmt: skip
    assert not prometheus.firing("DynamodNoPoolLeader")
    instance = leading[0]["metric"]["instance"]
    [(name, leader)] = [
        (n, d) for n, d in scraped.daemons.items()
        if urllib.parse.urlsplit(d.field("http")).netloc == instance
    ]  # fmt: skip
    killed = time.monotonic()
    leader.kill()
    eventually_blocking(
        lambda: prometheus.firing("DynamodNoPoolLeader"),
        within=LEASE_TTL - 5, every=0.5, what=f"DynamodNoPoolLeader after {name} was killed",
    )  # fmt: skip
    assert time.monotonic() - killed < LEASE_TTL
