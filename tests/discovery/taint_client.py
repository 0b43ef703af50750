"""A separate OS process that hammers one worker's taints (for the no-lost-update test).

Usage: python -m tests.discovery.taint_client STORE_URL KEY CLIENT_INDEX ROUNDS
Each round adds ``c<i>/r<round>`` and, on odd rounds, removes it again. Prints one JSON
line per operation: {"op": "add"|"remove", "taint": ..., "ok": bool, "error": str|null}.
Exits 0 unless an error other than the retryable conflict happened.
"""

from __future__ import annotations

import asyncio
import json
import sys

from dynamod.discovery.updates import update_taints
from dynamod.errors import ConflictError
from dynamod.store import open_store
from dynamod.taints import TaintUpdate


async def main(url: str, key: str, index: int, rounds: int) -> int:
    store = await open_store(url)
    try:
        for r in range(rounds):
            taint = f"c{index}/r{r}"
            ops = [("add", TaintUpdate.add([taint]))]
            if r % 2:
                ops.append(("remove", TaintUpdate.remove([taint])))
            for name, op in ops:
                try:
                    await update_taints(store, key, op)
                    result = {"op": name, "taint": taint, "ok": True, "error": None}
                except ConflictError as exc:
                    result = {"op": name, "taint": taint, "ok": False, "error": str(exc)}
                print(json.dumps(result), flush=True)
    finally:
        await store.aclose()
    return 0


if __name__ == "__main__":
    url, key, index, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    sys.exit(asyncio.run(main(url, key, index, rounds)))
