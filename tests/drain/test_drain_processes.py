"""Drain with real processes: a ``dynamod`` on a file store, two slowed-down mocker
workers (``--speedup-ratio 0.1``: a 2,000-token stream would run for minutes), requests
through the daemon's own front, and ``dynamoctl`` run as an operator runs it.

The stream on the drained worker is held open by the test until what it checks has been
seen (``workers ls -o json`` is sampled, so it is waited for under a deadline), and then
ended by the test closing it: the router's count and the engine's running request both
end there, and only then may the drain command return.
"""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.cli.conftest import (
    Cli,
    Cluster,
    assert_clean,
    on_terminal,
    start_cluster,
)
from tests.support.eventually import eventually_blocking
from tests.support.processes import BIN, Spawned, daemon_argv, dynamoctl, started

pytestmark = pytest.mark.timeout(240)

SLOW = ("--speedup-ratio", "0.1")
WITHIN = 30.0
"""Seconds a sampled signal (a listing, an engine's report) is given to show."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = start_cluster(tmp_path_factory.mktemp("drain"))
    try:
        started.start_workers(("llama", SLOW), ("llama", SLOW))
        started.seen([w.field("id") for w in started.workers])
        yield started
    finally:
        started.stop()


class LongStream:
    """A streamed completion through the front, in flight from the first token until
    ``end()`` closes it (its 2,000 tokens would take minutes)."""

    def __init__(self, front: str) -> None:
        where = urlsplit(front)
        self.connection = http.client.HTTPConnection(where.hostname or "", where.port, timeout=60)
        body = {"model": "llama", "prompt": f"drain {uuid.uuid4()}", "max_tokens": 2000}
        self.connection.request(
            "POST", "/v1/completions", json.dumps({**body, "stream": True}),
            {"content-type": "application/json"},
        )  # fmt: skip
        self.response = self.connection.getresponse()
        assert self.response.status == 200, self.response.read()
        self.worker = self.response.getheader("x-dynamo-worker-id") or ""
        assert self.response.readline().startswith(b"data: ")  # the first token: in flight

    def end(self) -> None:
        self.response.close()
        self.connection.close()


def complete(front: str) -> str:
    """A short completion through the front; the id of the worker that served it."""
    where = urlsplit(front)
    connection = http.client.HTTPConnection(where.hostname or "", where.port, timeout=60)
    try:
        body = {"model": "llama", "prompt": f"short {uuid.uuid4()}", "max_tokens": 2}
        connection.request(
            "POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"}
        )
        response = connection.getresponse()
        assert response.status == 200, response.read()
        response.read()
        return response.getheader("x-dynamo-worker-id") or ""
    finally:
        connection.close()


def listed(cli: Cli) -> dict[str, dict[str, Any]]:
    workers: list[dict[str, Any]] = json.loads(cli.ok("workers", "ls", "-o", "json").out)
    return {w["id"]: w for w in workers}


def until(cli: Cli, worker: str, check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The worker's listing once ``check`` holds for it; a listing is a sample, so it is
    taken again until then, for at most ``WITHIN`` seconds."""

    def holds() -> dict[str, Any] | None:
        seen = listed(cli).get(worker, {})
        return seen if seen and check(seen) else None

    return eventually_blocking(holds, within=WITHIN, what=f"the check on worker {worker}")


def post_taints(system: str, taints: list[str]) -> int:
    where = urlsplit(system)
    connection = http.client.HTTPConnection(where.hostname or "", where.port, timeout=30)
    try:
        body = json.dumps({"taints": taints})
        connection.request(
            "POST", "/engine/update/model_taints", body, {"content-type": "application/json"}
        )
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def worker_of(cluster: Cluster, worker: str) -> Spawned:
    return next(w for w in cluster.workers if w.field("id") == worker)


def other_than(cluster: Cluster, worker: str) -> str:
    return next(w.field("id") for w in cluster.workers[:2] if w.field("id") != worker)


def draining(seen: dict[str, Any]) -> bool:
    return bool(seen["state"] == "draining" and seen["load"]["active_requests"] == 1)


def test_a_worker_with_a_stream_in_flight_drains_when_it_ends(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Drain: the worker serving a long stream shows ``draining`` until the stream ends,
    then ``drained``; no new request reaches it; the drain command returns then (0,
    ``drained``). Another replica sees the drain, the worker's own route cannot lift it,
    ``uncordon`` ends it and traffic comes back."""
    cli, front = cluster.cli, cluster.daemon.field("http")
    stream = LongStream(front)
    drained, other = stream.worker, other_than(cluster, stream.worker)
    command = subprocess.Popen(
        dynamoctl("workers", "drain", drained),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env=cli.env(),
    )  # fmt: skip
    try:
        seen = until(cli, drained, draining)  # the stream holds it there until seen
        assert {"dynamo.io/cordoned", "dynamo.io/draining"} <= set(seen["taints"])
        seen = until(cli, drained, lambda w: (w["engine"] or {}).get("running") == 1)
        assert seen["state"] == "draining"
        assert listed(cli)[other]["state"] == "ready"
        assert [complete(front) for _ in range(4)] == [other] * 4  # nothing new reaches it
        assert command.poll() is None  # the stream is in flight: the drain cannot be over
        stream.end()
        out, err = command.communicate(timeout=WITHIN)
    finally:
        stream.end()
        if command.poll() is None:
            command.kill()
            command.communicate()
    assert command.returncode == 0, err
    assert out == "drained\n"
    assert_clean(err)
    seen = listed(cli)[drained]
    assert seen["state"] == "drained" and seen["load"]["active_requests"] == 0
    _another_replica_sees_it_drained(cluster, tmp_path, drained)
    _the_workers_own_route_cannot_lift_it(cluster, drained, other)
    result = cli.ok("workers", "uncordon", drained)
    assert "uncordoned (drain ended)" in result.out
    seen = until(cli, drained, lambda w: w["state"] == "ready")
    assert not {"dynamo.io/cordoned", "dynamo.io/draining"} & set(seen["taints"])
    _traffic_comes_back(cluster, drained)


def _another_replica_sees_it_drained(cluster: Cluster, root: Path, worker: str) -> None:
    """A second dynamod on the same store reads the drain from the worker's taints (its
    own router never sent anything there; the engine's figures say it is idle)."""
    sock = root / "replica.sock"
    argv = daemon_argv(cluster.store_url, sock)
    replica = started(argv, r"^dynamod ready:", root / "replica.log")
    try:
        cli = Cli(f"unix://{sock}", root / "home")
        seen = until(cli, worker, lambda w: w["engine"] is not None)
        assert seen["state"] == "drained"
        assert listed(cli)[worker]["state"] == "drained"
    finally:
        replica.stop()
    assert_clean(replica.log, "the replica's stderr")


def _the_workers_own_route_cannot_lift_it(cluster: Cluster, drained: str, other: str) -> None:
    assert post_taints(worker_of(cluster, drained).field("system"), []) == 200
    assert post_taints(worker_of(cluster, other).field("system"), ["dynamo.io/draining"]) == 403
    seen = listed(cluster.cli)[drained]
    assert {"dynamo.io/cordoned", "dynamo.io/draining"} <= set(seen["taints"])
    assert seen["state"] == "drained"


def _traffic_comes_back(cluster: Cluster, worker: str) -> None:
    """With a stream in flight on one worker, the next request goes to the idle one: so
    one of the two is the worker just uncordoned."""
    front = cluster.daemon.field("http")
    stream = LongStream(front)
    try:
        assert worker in {stream.worker, complete(front)}
    finally:
        stream.end()


def test_a_timeout_shorter_than_the_stream_names_what_is_in_flight(cluster: Cluster) -> None:
    cli, front = cluster.cli, cluster.daemon.field("http")
    stream = LongStream(front)
    worker = stream.worker
    try:
        result = cli.run("workers", "drain", worker, "--timeout", "1")
        assert result.code == 1, result.err
        (line,) = result.lines
        assert line.startswith(worker[:8]) and "draining: router 1, engine " in line
        assert "1 of 1 worker not drained within the timeout of 1 s" in result.err
        code, shown = on_terminal(cli, "workers", "drain", worker, "--timeout", "1")
        assert code == 1
        # On a terminal each change shows as it comes, then the same final line.
        assert f"dynamoctl: {worker[:8]} draining: router 1" in shown
        assert listed(cli)[worker]["state"] == "draining"  # the cordon stays
    finally:
        stream.end()
        cli.ok("workers", "uncordon", worker)
    until(cli, worker, lambda w: w["state"] == "ready")


def test_a_worker_whose_engine_is_unhealthy_shows_unhealthy(
    cluster: Cluster, tmp_path: Path
) -> None:
    """An ``--engine openai`` worker whose upstream server is killed reports its engine
    unhealthy: that state comes before any other."""
    upstream = started(
        [str(BIN / "dynamo-worker"), "--model", "side", "--store", (tmp_path / "s").as_uri()],
        r"^dynamo-worker ready:", tmp_path / "upstream.log",
    )  # fmt: skip
    sidecar = started(
        [
            str(BIN / "dynamo-worker"), "--engine", "openai", "--model", "side",
            "--upstream", upstream.field("http"), "--store", cluster.store_url,
            "--lease-ttl", "2", "--scrape-interval", "0.1",
        ],
        r"^dynamo-worker ready:", tmp_path / "sidecar.log",
    )  # fmt: skip
    try:
        worker = sidecar.field("id")
        until(cluster.cli, worker, lambda w: w["engine"] is not None)
        assert listed(cluster.cli)[worker]["state"] == "ready"
        upstream.stop(signal.SIGKILL)  # stays dead: the condition holds until seen
        seen = until(cluster.cli, worker, lambda w: w["state"] == "unhealthy")
        assert seen["engine"]["healthy"] is False
        cluster.cli.ok("workers", "cordon", worker)
        seen = until(cluster.cli, worker, lambda w: "dynamo.io/cordoned" in w["taints"])
        assert seen["state"] == "unhealthy"  # unhealthy comes before cordoned
    finally:
        sidecar.stop()
        upstream.kill()
