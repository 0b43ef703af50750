"""Hostile input on a worker's own taint route, ``POST /engine/update/model_taints``:
every refused request is a 400 (413 when too large) with a JSON error naming the problem,
the worker's record in the store is byte-for-byte unchanged, and the worker lives on."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynamod.errors import shown
from dynamod.records import WorkerRecord
from dynamod.taints import TOPOLOGY_PREFIX, caller_taints
from tests.fuzz.conftest import WORKER_TAINTS, WORKER_TOPOLOGY, Stack
from tests.fuzz.strategies import accepted_look_alikes, bad_taint_lists, invalid, json_values

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MAX_BODY = 64 * 1024  # the route's limit (dynamod.worker.system.MAX_BODY)


def post(url: str, body: bytes) -> tuple[int, Any]:
    """Status and decoded JSON answer of one POST (no retries, no redirects)."""
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def route(stack: Stack) -> str:
    return stack.system + "/engine/update/model_taints"


def well_formed(raw: bytes) -> bool:
    """A body the route would act on: a JSON object whose ``taints`` are valid strings."""
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return False
    taints = body.get("taints") if isinstance(body, dict) else None
    return isinstance(taints, list) and all(isinstance(t, str) and not invalid(t) for t in taints)


def test_refused_taints_get_a_400_naming_the_first_bad_one_and_write_nothing(
    stack: Stack,
) -> None:
    before = stack.record()

    @FUZZ
    @given(taints=bad_taint_lists)
    def refused(taints: list[str]) -> None:
        status, body = post(route(stack), json.dumps({"taints": taints}).encode())
        first = next(t for t in taints if invalid(t))
        assert status == 400, body
        assert body["error"] == "Bad request"
        assert shown(first) in body["message"]  # the taint, cut short when it is huge

    refused()
    assert stack.record() == before
    assert stack.worker.alive


def test_malformed_bodies_get_a_400_and_write_nothing(stack: Stack) -> None:
    before = stack.record()
    bodies = st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode())

    @FUZZ
    @given(raw=bodies.filter(lambda raw: not well_formed(raw)))
    def refused(raw: bytes) -> None:
        status, body = post(route(stack), raw)
        assert status == 400, body
        assert body["error"] == "Bad request" and body["message"]

    refused()
    assert stack.record() == before


def test_a_body_over_the_limit_gets_a_413_and_writes_nothing(stack: Stack) -> None:
    before = stack.record()
    status, body = post(route(stack), json.dumps({"taints": ["a" * MAX_BODY]}).encode())
    assert status == 413
    assert str(MAX_BODY) in body["message"]
    assert stack.record() == before


def test_a_look_alike_the_grammar_accepts_is_an_ordinary_taint(stack: Stack) -> None:
    """What gets through is never in the reserved namespace, and the generated topology
    taint stays exactly as it was."""
    topology = f"{TOPOLOGY_PREFIX}{WORKER_TOPOLOGY}"

    @settings(max_examples=40, deadline=None)
    @given(taint=accepted_look_alikes)
    def accepted(taint: str) -> None:
        assert not invalid(taint)
        status, body = post(route(stack), json.dumps({"taints": [taint]}).encode())
        assert status == 200, body
        assert body["taints"] == [taint] and not taint.startswith(TOPOLOGY_PREFIX)
        record = WorkerRecord.from_bytes(stack.record().value)
        assert [t for t in record.taints if t.startswith(TOPOLOGY_PREFIX)] == [topology]

    try:
        accepted()
    finally:
        restored = json.dumps({"taints": list(WORKER_TAINTS)}).encode()
        assert post(route(stack), restored)[0] == 200
    assert caller_taints(WorkerRecord.from_bytes(stack.record().value).taints) == WORKER_TAINTS
