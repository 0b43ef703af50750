"""A real dynamod process reading an NVIDIA Dynamo fleet's records from etcd (no Dynamo
process: records shaped exactly like the captured ones, ``values.py``): what many LoRA
cards under one worker cost it. The status latency under the same load is a benchmark
row (``python -m bench.dynamo_records``), never a timed test."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psutil
import pytest

from dynamod.client import AsyncClient
from dynamod.store.etcd import EtcdStore
from tests.dynamo import values
from tests.support.eventually import eventually
from tests.support.processes import daemon, running

pytestmark = pytest.mark.timeout(900)

WORKER = 0x13B0A2323C378618
ADAPTERS = 5000
GROWTH_MB = 100


async def test_5000_lora_cards_under_one_worker_grow_the_daemon_by_100_mb_at_most(
    dynamo_etcd: EtcdStore, dynamo_url: str, tmp_path: Path
) -> None:
    """Dynamo's vLLM worker registers a card per LoRA adapter under its own: 5,000 of
    them, and the daemon counts every one while its RSS grows by 100 MB at most (it grew
    by about 1 GB when each adapter rebuilt the worker with all of them)."""
    lease = await dynamo_etcd.grant(300)
    await dynamo_etcd.put(values.card_key(WORKER), values.card(WORKER), lease=lease)
    await dynamo_etcd.put(values.instance_key(WORKER), values.instance(WORKER), lease=lease)
    async with running(daemon(dynamo_url, tmp_path / "d.sock")) as proc:
        process = psutil.Process(proc.pid)
        async with AsyncClient(f"unix://{tmp_path / 'd.sock'}", timeout=60) as client:
            await client.get_worker(f"{WORKER:x}")
            before = process.memory_info().rss
            gate = asyncio.Semaphore(16)
            card = values.lora_card(WORKER)

            async def one(index: int) -> None:
                async with gate:
                    key = values.card_key(WORKER, f"lora-{index:05d}")
                    await dynamo_etcd.put(key, card, lease=lease)

            await asyncio.gather(*(one(i) for i in range(ADAPTERS)))
            shown = await eventually(
                lambda: client.get_worker(f"{WORKER:x}"),
                lambda w: w.record.extra["dynamo"].get("lora_count") == ADAPTERS,
                within=300, every=0.5, what=f"dynamod to count {ADAPTERS} adapters",
            )  # fmt: skip
            after = process.memory_info().rss
    await dynamo_etcd.revoke(lease)
    assert shown.record.extra["dynamo"]["loras"][:2] == ["lora-00000", "lora-00001"]
    grown = (after - before) / 2**20
    assert grown <= GROWTH_MB, f"the daemon's RSS grew by {grown:.0f} MB"
