"""A deliberately slow ``events tail`` client, as a process of its own.

    python -m tests.chaos.slow_tail unix:///path/dynamod.sock

It opens the event stream, reports the first event, then reads nothing more until a line
arrives on its stdin: meanwhile the stream backs up into gRPC's flow-control window and
then into the daemon. After that line it reads as fast as it can, writing one JSON line
per event (``kind``, ``revision``, and the taints of each worker it names) until stdin
closes.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator

from dynamod.client import AsyncClient
from dynamod.reports import EventInfo
from dynamod.tasks import race


def line_of(event: EventInfo) -> str:
    workers = event.workers if event.kind == "RESYNC" else (event.worker,)
    taints = {w.record.key: list(w.record.taints) for w in workers if w is not None}
    return json.dumps({"kind": event.kind, "revision": event.revision, "taints": taints})


async def stdin_lines() -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


async def drain(events: AsyncIterator[EventInfo]) -> None:
    async for event in events:
        print(line_of(event), flush=True)


async def main(endpoint: str) -> None:
    stdin = await stdin_lines()
    async with AsyncClient(endpoint) as client:
        events = aiter(client.tail_events())
        print(line_of(await anext(events)), flush=True)
        await stdin.readline()  # stuck until told: the slow part
        await race(drain(events), stdin.read())


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the test decides when this ends
    asyncio.run(main(sys.argv[1]))
