"""A Dynamo worker's own taint route, called from the daemon: the one place its answers
become our errors.

``POST {system}/engine/update/model_taints`` with ``{"taints": [...]}`` replaces the
worker's caller taints (Dynamo's ``dynamo.common.model_taints``; measured on Dynamo 1.6.1,
``tests/data/dynamo/route_responses.json``). Its answers, whatever their content type
(always ``text/plain``), read through ``dynamod.http.bounded``:

=====================================================  ===================================
Dynamo's answer                                        here
=====================================================  ===================================
200 ``{"status": "ok", "taints": [...]}``               the taints it now holds
200 ``{"status": "error", "message": ...}`` (starting  ``WorkerUnavailableError``, retryable
or stopping)
500 ``Python callback failed: ValueError: MESSAGE``     ``InvalidInputError(MESSAGE)``
404 (no such route: the worker never registered it)    ``UnsupportedError``, saying why
no answer within ``within``, connection refused        ``WorkerUnavailableError``, retryable
anything else                                          ``UpstreamError`` with the status
=====================================================  ===================================

Dynamo's system port has no authentication: whoever reaches it can retarget the worker's
traffic. dynamod needs network reach to it, and should be the only thing that has it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import aiohttp

from dynamod import jsoncodec
from dynamod.errors import (
    InvalidInputError,
    UnsupportedError,
    UpstreamError,
    WorkerUnavailableError,
    shown,
)
from dynamod.http.bounded import read_body
from dynamod.http.failures import described

ROUTE: Final = "/engine/update/model_taints"
MAX_ANSWER: Final = 64 * 1024
"""Bytes of the route's answer read at most (an answer lists the taints it holds)."""
TIMEOUT: Final = 5.0
VALUE_ERROR: Final = "ValueError: "


async def post_taints(
    system: str, taints: Sequence[str], *, worker: str, within: float = TIMEOUT
) -> tuple[str, ...]:
    """Replace worker ``worker``'s caller taints with ``taints`` through its route at
    ``system``, waiting ``within`` seconds at most; the taints it answers it holds.
    Errors: see the module docstring."""
    if not system:
        raise UnsupportedError(
            f"worker {worker} has no known system address: its model card names no URL on "
            "its system port (is DYN_SYSTEM_PORT set for it?); set dynamo_system_address "
            "(a template such as 'http://{host}:9090') or dynamo_system_addresses (by id) "
            "in dynamod's settings"
        )
    url = system.rstrip("/") + ROUTE
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=within)) as session,
            session.post(url, json={"taints": list(taints)}, allow_redirects=False) as response,
        ):
            body = await read_body(response, MAX_ANSWER, f"worker {worker}'s taint route answer")
            status = response.status
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        reason = described(exc) if str(exc) else f"no answer within {within:g} s"
        raise WorkerUnavailableError(
            worker, f"worker {worker}'s taint route at {url} did not answer: {reason}"
        ) from None
    return answer(status, body, worker=worker, url=url)


def answer(status: int, body: bytes, *, worker: str, url: str) -> tuple[str, ...]:
    """What the route's answer means (see the module docstring)."""
    found = _json(body)
    message = str(found.get("message", "")) if found is not None else ""
    if status == 200 and found is not None and found.get("status") == "ok":
        held = found.get("taints")
        if isinstance(held, list) and all(isinstance(t, str) for t in held):
            return tuple(held)
    if status == 200 and found is not None and found.get("status") == "error":
        raise WorkerUnavailableError(
            worker, f"worker {worker} cannot update its taints now: {message or 'no reason'}"
        )
    if status == 404:
        raise UnsupportedError(
            f"worker {worker} has no taint route: {url} answered 404 ({message or 'not found'})."
            " The worker never registered Dynamo's register_model_taint_route: Dynamo 1.6.1's "
            "vLLM, SGLang and TRT-LLM workers do, its mocker does not"
        )
    if status == 500 and VALUE_ERROR in message:
        # Dynamo's own words for what it refused (a reserved prefix, a malformed body).
        raise InvalidInputError(message.split(VALUE_ERROR, 1)[1])
    raise UpstreamError(
        f"worker {worker}'s taint route at {url} answered {status}: "
        f"{shown(body.decode(errors='replace'), 300)}"
    )


def _json(body: bytes) -> dict[str, Any] | None:
    try:
        found = jsoncodec.read(body, "the route's answer")
    except InvalidInputError:
        return None
    return found if isinstance(found, dict) else None
