"""Dynamo's floor: requests straight to the mocker over Dynamo's request plane (Dynamo's venv).

    <dynamo venv>/bin/python bench/peer/direct.py INSTANCE_ID MAX_TOKENS < commands

Dynamo's workers have no HTTP route: the frontend tokenizes, routes, and sends the worker a
pre-tokenized request over TCP (msgpack), as this client does with Dynamo's own runtime
(``Client.direct``, pinned to INSTANCE_ID): what is left when the frontend is taken away.
The prompt's token ids are read from the first line of stdin (a JSON list), then one JSON
command per line, each answered with one JSON line on stdout:

    {"op": "seq", "n": N}                          -> {"ns": [...]}  whole request, one at a time
    {"op": "first", "n": N}                        -> {"ns": [...]}  to the first streamed item
    {"op": "load", "concurrency": C, "seconds": S} -> {"ns": [...], "seconds": wall, "errors": E}

Every request must come back with MAX_TOKENS tokens, or the helper exits 1 with the reason.
It answers {"ready": true} once the worker is discovered; end of stdin ends it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from dynamo.runtime import DistributedRuntime  # type: ignore[import-not-found]  # Dynamo's venv
from dynamo.runtime.logging import (  # type: ignore[import-not-found]
    configure_dynamo_logging,
)

ENDPOINT = "dynamo.backend.generate"


class Direct:
    def __init__(self, client: Any, instance: int, request: dict[str, Any], tokens: int) -> None:
        self.client, self.instance, self.request, self.tokens = client, instance, request, tokens

    async def one(self, *, first_only: bool = False) -> int:
        """One request; ns to its end, or to its first item with ``first_only``."""
        started = time.perf_counter_ns()
        first = None
        usage = None
        async for item in await self.client.direct(self.request, self.instance, annotated=False):
            first = first or time.perf_counter_ns()
            usage = item.get("completion_usage") or usage
        ended = time.perf_counter_ns()
        got = (usage or {}).get("completion_tokens")
        if got != self.tokens:
            raise RuntimeError(f"the worker answered {got} tokens, not {self.tokens}")
        return (first if first_only and first else ended) - started

    async def seq(self, n: int, *, first_only: bool = False) -> dict[str, Any]:
        return {"ns": [await self.one(first_only=first_only) for _ in range(n)]}

    async def load(self, concurrency: int, seconds: float) -> dict[str, Any]:
        samples: list[int] = []
        errors = 0
        started = time.perf_counter()
        stop_at = started + seconds

        async def loop() -> None:
            nonlocal errors
            while time.perf_counter() < stop_at:
                try:
                    samples.append(await self.one())
                except RuntimeError:
                    errors += 1

        async with asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                group.create_task(loop())
        return {"ns": samples, "seconds": time.perf_counter() - started, "errors": errors}


async def serve(instance: int, tokens: int) -> None:
    lines = asyncio.StreamReader(limit=64 * 1024 * 1024)  # a long prompt's ids on one line
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(lines), sys.stdin)
    prompt = json.loads(await lines.readline())
    runtime = DistributedRuntime(loop, "etcd", "tcp")
    try:
        client = await runtime.endpoint(ENDPOINT).client()
        await client.wait_for_instances()
        request = {
            "token_ids": prompt,
            "stop_conditions": {"max_tokens": tokens, "ignore_eos": True},
            "sampling_options": {"temperature": 0.0},
            "output_options": {},
            "eos_token_ids": [],
        }
        direct = Direct(client, instance, request, tokens)
        await direct.one()  # the connection to the worker is made on first use
        _say({"ready": True})
        while line := await lines.readline():
            command = json.loads(line)
            if command["op"] == "load":
                _say(await direct.load(command["concurrency"], command["seconds"]))
            else:
                _say(await direct.seq(command["n"], first_only=command["op"] == "first"))
    finally:
        runtime.shutdown()


def _say(answer: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    configure_dynamo_logging()
    try:
        asyncio.run(serve(int(argv[0]), int(argv[1])))
    except RuntimeError as exc:
        print(f"peer_direct: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
