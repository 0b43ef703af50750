"""The other process of the file store's integration tests.

``python -m tests.store.file_store_child <command> <store url> [args]``; each command
reports its milestones as lines on stdout, which the tests read:

``incr KEY N``
    prints ``ready``, waits for a line on stdin (so that racers start together), makes ``N``
    compare-and-swap increments of the integer in ``KEY``, prints ``done <lost races>``.
``put KEY VALUE``
    one put; prints its revision.
``hold KEY TTL``
    grants a lease, puts ``KEY`` under it, prints ``held <revision>``, keeps the lease alive
    until killed.
``churn``
    puts and deletes keys under ``churn/`` (some bound to a lease) until killed, printing a
    line after each change.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import sys
from collections.abc import Awaitable, Callable

from dynamod.errors import RevisionMismatchError
from dynamod.store import keep_alive
from dynamod.store.file import FileStore


async def incr(store: FileStore, key: str, count: str) -> None:
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    lost = 0
    for _ in range(int(count)):
        while True:
            entry = await store.get(key)
            assert entry is not None, f"{key} must exist before the race"
            # Widen the read-to-write window, so that the racers really collide.
            await asyncio.sleep(random.uniform(0, 0.001))
            try:
                await store.put(key, b"%d" % (int(entry.value) + 1), expect=entry.revision)
                break
            except RevisionMismatchError:
                lost += 1
    print(f"done {lost}", flush=True)


async def put(store: FileStore, key: str, value: str) -> None:
    print(await store.put(key, value.encode()), flush=True)


async def hold(store: FileStore, key: str, ttl: str) -> None:
    lease = await store.grant(float(ttl))
    revision = await store.put(key, b"alive", lease=lease)
    print(f"held {revision}", flush=True)
    await keep_alive(store, lease)


async def churn(store: FileStore) -> None:
    lease = await store.grant(60)
    for i in itertools.count():
        key = f"churn/{i % 13}"
        if i % 5 == 4:
            await store.delete(key)
        else:
            bound = lease if i % 3 == 0 else None
            await store.put(key, b"value %d " % i * (i % 7), lease=bound)
        print(i, flush=True)
        # Paced, so that the test's kill lands within a few changes of the lines it read.
        await asyncio.sleep(0.0005)


COMMANDS: dict[str, Callable[..., Awaitable[None]]] = {
    "incr": incr,
    "put": put,
    "hold": hold,
    "churn": churn,
}


async def main(command: str, url: str, *args: str) -> None:
    store = await FileStore.open(url)
    try:
        await COMMANDS[command](store, *args)
    finally:
        await store.aclose()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
