"""A worker answering 200 with an empty or unparseable whole body (issue 28), with real
processes: the client gets a 502 naming the worker (code ``worker_failed``), never a 200
it cannot read; the worker is counted as failed (``reason="broken"``) and logged; when
another worker may take the request it is tried and answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile_workers.test_front import (
    MODEL,
    client,
    fake_worker,
    front,
    metric,
    post,
    requiring,
)
from tests.support.processes import running, worker

pytestmark = pytest.mark.timeout(180)

TAINTS = ("--taint", "ok", "--taint")
"""The empty worker and the honest one hold ``ok``: a request requiring it may be retried."""


async def test_an_empty_or_unparseable_200_is_a_502_naming_the_worker(tmp_path: Path) -> None:
    store = (tmp_path / "store").as_uri()
    body = {"model": MODEL, "prompt": "hello world", "max_tokens": 2}
    async with (
        running(fake_worker(store, "--id", "e" * 16, "--mode", "empty", *TAINTS, "e")) as empty,
        running(fake_worker(store, "--id", "d" * 16, "--mode", "not-json", "--taint", "j")) as odd,
        running(worker(store, *TAINTS, "honest")) as honest,
        running(front(store, tmp_path, workers=3)) as daemon,
        client() as http,
    ):
        url = daemon.field("http")
        assert (await post(http, url, {**body, **requiring("honest")}))[0] == 200
        for _ in range(3):
            status, error, worker_id = await post(http, url, {**body, **requiring("e")})
            assert (status, worker_id) == (502, empty.field("id")), error
            assert error["error"]["code"] == "worker_failed"
            said = error["error"]["message"]
            assert said.startswith(f"worker {empty.field('id')} answered 200 with an empty body;")
        status, error, worker_id = await post(http, url, {**body, **requiring("j")})
        assert (status, worker_id) == (502, odd.field("id")), error
        assert "answered 200 with a body that is not JSON" in error["error"]["message"]
        prefer = {"preferred_taints": {"e": 1.0}, "required_taints": ["ok"]}
        status, _, worker_id = await post(
            http, url, {**body, "nvext": {"routing_constraints": prefer}}
        )
        assert (status, worker_id) == (200, honest.field("id"))  # tried the empty one first
        assert await metric(
            http, daemon, 'dynamod_front_worker_failures_total{reason="broken"} 5.0'
        )
    assert daemon.stderr.count(f"worker {empty.field('id')} answered 200 with an empty") == 4
