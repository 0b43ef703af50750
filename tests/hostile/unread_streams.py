"""A hostile API client, as a process of its own: it opens many API streams and never
reads a message of any.

    python -m tests.hostile.unread_streams ENDPOINT TOKEN STREAMS [tail|wait-drained]

``tail`` (the default) opens ``TailEvents`` streams; ``wait-drained`` opens ``WaitDrained``
streams for every worker after a revision the store never reaches, so each would hold
until cancelled. An empty TOKEN sends none (the unix socket). Each stream starts (its
headers arrive, or its refusal); then one JSON line goes to stdout: ``{"open": N,
"refused": {"CODE": N}, "details": [...]}`` (the distinct refusal messages), and the
process sleeps, still reading nothing, until it is killed. Its gRPC library takes what
fits its flow-control window; the rest stays with the daemon.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from typing import Any

from grpc import aio

from dynamod.api.convert import wait_drained_to_pb
from dynamod.api.v1 import dynamo_pb2 as pb
from dynamod.api.v1 import dynamo_pb2_grpc as rpc
from dynamod.targets import Target

PER_CHANNEL = 50  # below HTTP/2's usual limit of 100 streams on one connection
NEVER = 10**15
"""An ``after_revision`` the store never reaches: a drain wait holds until it is cancelled."""


async def started(call: Any) -> None:
    async with asyncio.timeout(60):
        await call.initial_metadata()


def open_stream(channel: aio.Channel, kind: str, metadata: tuple[tuple[str, str], ...]) -> Any:
    if kind == "tail":
        return rpc.EventServiceStub(channel).TailEvents(pb.TailEventsRequest(), metadata=metadata)
    request = wait_drained_to_pb(Target(all=True), None, NEVER)
    return rpc.WorkerServiceStub(channel).WaitDrained(request, metadata=metadata)


async def main(endpoint: str, token: str, streams: int, kind: str) -> None:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    channels = [aio.insecure_channel(endpoint) for _ in range(-(-streams // PER_CHANNEL))]
    calls = [open_stream(channels[i // PER_CHANNEL], kind, metadata) for i in range(streams)]
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
    kinds = ("tail", "wait-drained")
    chosen = sys.argv[4] if len(sys.argv) > 4 else "tail"
    if chosen not in kinds:
        sys.exit(f"unread_streams: the kind must be one of {', '.join(kinds)}, got {chosen!r}")
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), chosen))
