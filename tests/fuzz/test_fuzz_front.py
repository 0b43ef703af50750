"""Hostile ``nvext`` on dynamod's OpenAI-compatible front: a request whose routing
constraints (or ``max_wait``) are malformed is a 400 naming the ``nvext`` field, one whose
constraints are well-formed is routed (200) or refused because no worker holds them (503),
and nothing else happens: no 500, no write to the store, the daemon lives on."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dynamod.errors import TaintError
from dynamod.taints import validate
from tests.fuzz.conftest import MODEL, Stack
from tests.fuzz.strategies import any_taint, json_values

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
QUICK_WAIT = 0.05
FLOAT_MAX = 1.7976931348623157e308  # the most a well-formed request may ask to wait for a worker

numbers = (
    st.integers()
    | st.sampled_from((2**1024, -(2**1024), 10**400))  # past what a float can hold
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.floats(min_value=-1, max_value=1)
)
constraints = st.fixed_dictionaries(
    {},
    optional={
        "required_taints": st.none() | st.lists(any_taint, max_size=3) | json_values,
        "preferred_taints": st.none()
        | st.dictionaries(any_taint, numbers | json_values, max_size=3)
        | json_values,
        "unknown": json_values,
    },
)
nvexts = json_values | st.fixed_dictionaries(
    {"routing_constraints": constraints | json_values},
    optional={"max_wait": numbers | json_values | st.floats(min_value=0, max_value=QUICK_WAIT)},
)


def taint_ok(taint: object) -> bool:
    if not isinstance(taint, str):
        return False
    try:
        validate(taint, allow_reserved=True)  # a request may require a topology taint
    except TaintError:
        return False
    return True


def finite(value: object) -> bool:
    """A JSON number a float can hold: not a bool, not NaN or infinite, not an integer
    past the float range (JSON integers have no size limit)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return abs(value) <= FLOAT_MAX if isinstance(value, int) else math.isfinite(value)


def weight_ok(weight: object) -> bool:
    return finite(weight) and -1 <= weight <= 1  # type: ignore[operator]


def constraints_ok(value: object) -> bool:
    """The documented shape of ``nvext.routing_constraints``, written out independently."""
    if value is None:
        return True
    if not isinstance(value, dict) or set(value) - {"required_taints", "preferred_taints"}:
        return False
    required = value.get("required_taints")
    preferred = value.get("preferred_taints")
    required_ok = required is None or (
        isinstance(required, list) and all(taint_ok(t) for t in required)
    )
    preferred_ok = preferred is None or (
        isinstance(preferred, dict)
        and all(taint_ok(t) and weight_ok(w) for t, w in preferred.items())
    )
    return required_ok and preferred_ok


def max_wait_ok(value: object) -> bool:
    return value is None or (finite(value) and value >= 0)  # type: ignore[operator]


def nvext_ok(nvext: object) -> bool:
    if nvext is None:
        return True
    if not isinstance(nvext, dict):
        return False
    return constraints_ok(nvext.get("routing_constraints")) and max_wait_ok(nvext.get("max_wait"))


def is_json(value: object) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True


def quick(nvext: object) -> bool:
    """A well-formed request must not ask to wait long: it may want a taint nobody has."""
    wait = nvext.get("max_wait") if isinstance(nvext, dict) else None
    return not (nvext_ok(nvext) and isinstance(wait, int | float) and wait > QUICK_WAIT)


def complete(front: str, nvext: object) -> tuple[int, dict[str, Any]]:
    body = {"model": MODEL, "prompt": "hello there", "max_tokens": 1, "nvext": nvext}
    request = urllib.request.Request(
        front + "/v1/completions",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, _json(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, _json(error.read())


def _json(raw: bytes) -> dict[str, Any]:
    """The answer's JSON object; a plain-text answer (aiohttp's own 500) kept as ``raw``."""
    try:
        found: dict[str, Any] = json.loads(raw)
    except ValueError:
        return {"raw": raw.decode(errors="replace")}
    return found


def test_routing_constraints_of_any_shape_get_a_clear_answer_and_write_nothing(
    stack: Stack,
) -> None:
    before = stack.record()

    @FUZZ
    @given(nvext=nvexts.filter(quick))
    @example(nvext={"routing_constraints": {"preferred_taints": {"a": 10**400}}})
    @example(nvext={"routing_constraints": {}, "max_wait": 10**400})
    @example(nvext={"routing_constraints": {}, "max_wait": math.inf})
    @example(nvext={"routing_constraints": {"required_taints": ["dynamo.topology/zone=z1"]}})
    def answered(nvext: object) -> None:
        status, body = complete(stack.front, nvext)
        if not is_json(nvext):  # Python writes inf and nan as Infinity and NaN: not JSON
            assert status == 400, body
            assert "is not valid JSON" in body["error"]["message"], body
        elif nvext_ok(nvext):
            assert status in (200, 503), body
            assert status == 200 or body["error"]["code"] == "no_eligible_worker", body
        else:
            assert status == 400, body
            error = body["error"]
            assert error["type"] == "invalid_request_error"
            assert str(error["param"]).startswith("nvext") and error["message"]

    answered()
    assert stack.record() == before
    assert stack.daemon.alive
