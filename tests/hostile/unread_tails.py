"""A hostile API client, as a process of its own: it opens many ``TailEvents`` streams and
never reads a message of any.

    python -m tests.hostile.unread_tails ENDPOINT TOKEN STREAMS

Each stream starts (its headers arrive, or its refusal); then one JSON line goes to
stdout: ``{"open": N, "refused": {"CODE": N}, "details": [...]}`` (the distinct refusal
messages), and the process sleeps, still reading nothing, until it is killed. Its gRPC
library takes what fits its flow-control window; the rest stays with the daemon.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from typing import Any

from grpc import aio

from dynamod.api.v1 import dynamo_pb2 as pb
from dynamod.api.v1 import dynamo_pb2_grpc as rpc

PER_CHANNEL = 50  # below HTTP/2's usual limit of 100 streams on one connection


async def started(call: Any) -> None:
    async with asyncio.timeout(60):
        await call.initial_metadata()


async def main(endpoint: str, token: str, streams: int) -> None:
    metadata = (("authorization", f"Bearer {token}"),)
    channels = [aio.insecure_channel(endpoint) for _ in range(-(-streams // PER_CHANNEL))]
    calls = [
        rpc.EventServiceStub(channels[i // PER_CHANNEL]).TailEvents(
            pb.TailEventsRequest(), metadata=metadata
        )
        for i in range(streams)
    ]
    await asyncio.gather(*(started(call) for call in calls))
    refused: Counter[str] = Counter()
    details: list[str] = []
    for call in calls:
        if call.done():
            refused[(await call.code()).name] += 1
            if (detail := await call.details()) not in details:
                details.append(detail)
    report = {"open": streams - refused.total(), "refused": refused, "details": details}
    print(json.dumps(report), flush=True)
    await asyncio.Event().wait()  # read nothing, ever


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
