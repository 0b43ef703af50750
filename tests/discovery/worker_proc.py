"""A separate OS process that registers one worker and keeps it alive until killed.

Usage: python -m tests.discovery.worker_proc STORE_URL INSTANCE_ID TTL
Prints "registered <key>" once the record is stored.
"""

from __future__ import annotations

import asyncio
import sys

from dynamod.discovery.registration import Registration
from dynamod.store import open_store
from tests.support.factories import make_record


async def main(url: str, instance_id: str, ttl: float) -> None:
    store = await open_store(url)
    try:
        record = make_record(instance_id=instance_id, taints=["capacity/fast"])
        async with Registration(store, record, ttl=ttl) as registration:
            print(f"registered {registration.record.key}", flush=True)
            await asyncio.Event().wait()
    finally:
        await store.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
