"""A worker the router leaves out by design says so, on real processes (issue 27, item 6).

Two real mocker workers and a fake one (``front_fakes.py``) whose card reads bodies with
another KV block size — the only one holding the taint ``side``. Before: ``workers ls``
showed it ``ready``, and a request requiring ``side`` got a 503 that named only the honest
workers (``has zone=a (missing side)``), hiding the one that held it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.hostile_workers.test_front import (
    MODEL,
    ODD,
    client,
    fake_worker,
    front,
    post,
    requiring,
)
from tests.support.processes import dynamoctl, env, running, worker

pytestmark = pytest.mark.timeout(120)


async def ctl(socket: Path, *args: str, code: int = 0) -> str:
    """``dynamoctl ARGS``'s stdout; it must exit ``code``."""
    process = await asyncio.create_subprocess_exec(
        *dynamoctl("--endpoint", f"unix://{socket}", *args),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env(),
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == code, err.decode()
    return out.decode()


async def test_a_worker_of_another_reading_is_excluded_with_the_reason_everywhere(
    tmp_path: Path,
) -> None:
    store, socket = (tmp_path / "store").as_uri(), tmp_path / "d.sock"
    body = {"model": MODEL, "prompt": "hello world", "max_tokens": 4}
    async with (
        running(fake_worker(store, "--id", ODD, "--block-size", "1", "--taint", "side")),
        running(worker(store, "--taint", "zone=a")) as zoned,
        running(worker(store, "--taint", "zone=a")),
        running(front(store, tmp_path, workers=3)) as daemon,
        client() as http,
    ):
        listed: dict[str, Any] = {
            w["id"]: w for w in json.loads(await ctl(socket, "workers", "ls", "-o", "json"))
        }
        odd = listed[ODD]
        assert odd["state"] == "excluded", odd
        assert "block size 1) disagrees with its model's other workers" in odd["state_reason"]
        assert listed[zoned.field("id")]["state"] == "ready"
        assert listed[zoned.field("id")]["state_reason"] == ""
        wide = await ctl(socket, "workers", "ls", "-o", "wide")
        (row,) = [line for line in wide.splitlines() if line.startswith(ODD[:8])]
        assert "excluded (its reading (" in row
        # The refusal names it, with its reading, after the honest workers.
        status, error, _ = await post(http, daemon.field("http"), {**body, **requiring("side")})
        assert status == 503, error
        message = error["error"]["message"]
        assert "2 workers: " in message and "(missing side)" in message
        assert "; 1 more worker excluded, reading bodies otherwise than the model's" in message
        assert f"): {ODD} (tokenizer " in message and message.endswith("block size 1)")
        # So does route explain (exit 1: no worker is eligible).
        explain = ("route", "explain", "--model", MODEL, "--require", "side", "-o", "json")
        explained = json.loads(await ctl(socket, *explain, code=1))
        (shown,) = [c for c in explained["candidates"] if c["id"] == ODD]
        assert not shown["eligible"] and shown["reason"] == f"excluded: {odd['state_reason']}"
        # And top, as workers ls.
        frame = json.loads(await ctl(socket, "top", "--once", "-o", "json"))
        states = {row["id"]: row["state"] for row in frame["rows"]}
        assert states[ODD] == "excluded" and states[zoned.field("id")] == "ready", states
        assert frame["states"].get("excluded") == 1, frame["states"]
