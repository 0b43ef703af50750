"""Hostile requests on dynamod's gRPC API, sent with the raw stubs so that anything the
wire allows can be sent (unknown enum values, missing targets, NaN weights, megabytes):
every refused request is ``INVALID_ARGUMENT`` (``RESOURCE_EXHAUSTED`` past the message
size limit) with a message naming the problem, nothing reaches the store, and the daemon
answers the next call."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynamod.api.v1 import dynamo_pb2 as pb
from dynamod.api.v1 import dynamo_pb2_grpc as rpc
from dynamod.errors import TaintError, quoted
from dynamod.taints import removable, validate
from tests.fuzz.conftest import MODEL, Stack
from tests.fuzz.strategies import any_taint, bad_taint_lists, invalid, nasty_text

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TIMEOUT = 10.0
ACTIONS = (pb.TAINT_ACTION_REPLACE, pb.TAINT_ACTION_ADD, pb.TAINT_ACTION_REMOVE)


@dataclass(frozen=True)
class Api:
    workers: rpc.WorkerServiceStub
    taints: rpc.TaintServiceStub
    router: rpc.RouterServiceStub
    status: rpc.StatusServiceStub


@pytest.fixture(scope="module")
def api(stack: Stack) -> Iterator[Api]:
    channel = grpc.insecure_channel(f"unix://{stack.socket}")
    try:
        yield Api(
            rpc.WorkerServiceStub(channel),
            rpc.TaintServiceStub(channel),
            rpc.RouterServiceStub(channel),
            rpc.StatusServiceStub(channel),
        )
    finally:
        channel.close()


def refusal(call: grpc.UnaryUnaryMultiCallable[Any, Any], request: object) -> grpc.RpcError:
    """The error ``call`` must end with; a reply instead fails the test."""
    try:
        reply = call(request, timeout=TIMEOUT)
    except grpc.RpcError as error:
        return error
    raise AssertionError(f"accepted: {request!r} → {reply!r}")


def details(error: grpc.RpcError) -> str:
    return error.details() or ""


def code(error: grpc.RpcError) -> grpc.StatusCode:
    return error.code()


def status_of(call: grpc.UnaryUnaryMultiCallable[Any, Any], request: object) -> grpc.StatusCode:
    """``OK``, or the code the call failed with."""
    try:
        call(request, timeout=TIMEOUT)
    except grpc.RpcError as error:
        return code(error)
    return grpc.StatusCode.OK


def assert_untouched(stack: Stack, api: Api, before: object) -> None:
    assert stack.record() == before
    api.status.GetStatus(pb.StatusRequest(), timeout=TIMEOUT)  # and it still answers


def unremovable(taint: str) -> bool:
    try:
        removable(taint)
    except TaintError:
        return True
    return False


def test_refused_taints_are_invalid_argument_and_never_written(stack: Stack, api: Api) -> None:
    before = stack.record()

    @FUZZ
    @given(taints=bad_taint_lists, action=st.sampled_from(ACTIONS))
    def refused(taints: list[str], action: pb.TaintAction.ValueType) -> None:
        request = pb.UpdateTaintsRequest(action=action, taints=taints, worker=stack.key)
        # A removal takes any taint a worker may hold by its exact value (NVIDIA Dynamo's
        # route sets ones outside our grammar): only what ``removable`` refuses is refused,
        # and a removal of taints the worker does not hold changes nothing.
        bad = unremovable if action == pb.TAINT_ACTION_REMOVE else invalid
        first = next((t for t in taints if bad(t)), None)
        if first is None:
            reply = api.taints.UpdateTaints(request, timeout=TIMEOUT)
            assert [tuple(r.before) == tuple(r.after) for r in reply.results] == [True]
            return
        error = refusal(api.taints.UpdateTaints, request)
        assert code(error) == grpc.StatusCode.INVALID_ARGUMENT, details(error)
        assert quoted(first)[:40] in details(error)

    refused()
    assert_untouched(stack, api, before)


def test_requests_without_an_action_or_a_target_are_refused(stack: Stack, api: Api) -> None:
    before = stack.record()
    unknown_actions = st.sampled_from((pb.TAINT_ACTION_UNSPECIFIED, 5, 99, -1))

    @FUZZ
    @given(
        action=unknown_actions | st.sampled_from(ACTIONS),
        taints=st.lists(any_taint, max_size=3),
        target=st.sampled_from(("worker", "selector", "all", "none")),
        text=nasty_text,
    )
    def refused(action: int, taints: list[str], target: str, text: str) -> None:
        kind = cast("pb.TaintAction.ValueType", action)
        request = pb.UpdateTaintsRequest(action=kind, taints=taints)
        if action in ACTIONS:
            target = "none"  # a known action must then lack its target
        if target == "worker":
            request.worker = text or stack.key
        elif target == "selector":
            request.selector = text
        elif target == "all":
            request.all = True
        error = refusal(api.taints.UpdateTaints, request)
        assert code(error) == grpc.StatusCode.INVALID_ARGUMENT, details(error)
        assert details(error)

    refused()
    assert_untouched(stack, api, before)


def test_remove_by_malformed_keys_is_refused(stack: Stack, api: Api) -> None:
    before = stack.record()
    keys = st.lists(any_taint, min_size=1, max_size=3).filter(
        lambda ks: any(invalid(k) or "=" in k for k in ks)
    )

    @FUZZ
    @given(keys=keys)
    def refused(keys: list[str]) -> None:
        request = pb.UpdateTaintsRequest(action=pb.TAINT_ACTION_REMOVE, keys=keys, worker=stack.key)
        error = refusal(api.taints.UpdateTaints, request)
        assert code(error) == grpc.StatusCode.INVALID_ARGUMENT, details(error)

    refused()
    assert_untouched(stack, api, before)


def test_a_message_over_the_size_limit_is_refused_whole(stack: Stack, api: Api) -> None:
    before = stack.record()
    request = pb.UpdateTaintsRequest(
        action=pb.TAINT_ACTION_ADD, taints=["a" * (5 * 2**20)], worker=stack.key
    )
    error = refusal(api.taints.UpdateTaints, request)
    assert code(error) in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INVALID_ARGUMENT)
    assert_untouched(stack, api, before)


def constraint_ok(taint: str) -> bool:
    try:
        validate(taint, allow_reserved=True)
    except TaintError:
        return False
    return True


def test_explain_with_hostile_constraints_answers_or_refuses_clearly(
    stack: Stack, api: Api
) -> None:
    weights = st.floats(allow_nan=True, allow_infinity=True) | st.floats(min_value=-1, max_value=1)

    @FUZZ
    @given(
        required=st.lists(any_taint, max_size=3),
        preferred=st.dictionaries(any_taint, weights, max_size=3),
    )
    def explained(required: list[str], preferred: dict[str, float]) -> None:
        request = pb.ExplainRequest(
            model=MODEL, required_taints=required, preferred_taints=preferred, prompt="hi"
        )
        fine = all(constraint_ok(t) for t in [*required, *preferred]) and all(
            math.isfinite(w) and -1 <= w <= 1 for w in preferred.values()
        )
        if fine:
            api.router.Explain(request, timeout=TIMEOUT)
        else:
            error = refusal(api.router.Explain, request)
            assert code(error) == grpc.StatusCode.INVALID_ARGUMENT, details(error)

    explained()


def test_list_and_get_with_hostile_text_never_fail_internally(stack: Stack, api: Api) -> None:
    clear = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}

    @FUZZ
    @given(selector=nasty_text | any_taint, ref=nasty_text)
    def answered(selector: str, ref: str) -> None:
        assert status_of(api.workers.ListWorkers, pb.ListWorkersRequest(selector=selector)) in clear
        assert status_of(api.workers.GetWorker, pb.GetWorkerRequest(id=ref)) in clear

    answered()


def test_a_huge_taint_is_refused_with_a_message_of_bounded_size(stack: Stack, api: Api) -> None:
    """20 kB of taint fits a request, but a message quoting it whole would not fit the
    8 kB of metadata a gRPC client accepts: the caller would get RESOURCE_EXHAUSTED
    ("Stream removed") instead of the reason."""
    before = stack.record()
    huge = "a" * 20_000
    calls = (
        (api.taints.UpdateTaints, pb.UpdateTaintsRequest(
            action=pb.TAINT_ACTION_ADD, taints=[huge], worker=stack.key)),
        (api.router.Explain, pb.ExplainRequest(model=MODEL, required_taints=[huge])),
        (api.workers.ListWorkers, pb.ListWorkersRequest(selector=huge)),
    )  # fmt: skip
    for call, request in calls:
        error = refusal(call, request)
        assert code(error) == grpc.StatusCode.INVALID_ARGUMENT, details(error)[:300]
        assert "a" * 20 in details(error) and len(details(error)) < 1024
    assert_untouched(stack, api, before)
