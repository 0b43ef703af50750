"""A worker never registers a record its own reader refuses, and writing its record back
over out-of-band changes is paced by the one back-off: a writer spoiling the record as
fast as it can gets a few write-backs a second, not one per spoil (before: the sidecar
with ``max_model_len: true`` rewrote its own refused record ~2,500 times a second)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from dynamod.discovery.registration import Registration, readable, register
from dynamod.errors import InvalidInputError
from dynamod.records import ModelCard
from dynamod.store import KEEP, Put, open_store
from dynamod.tasks import cancel_and_wait
from tests.support.factories import make_record

pytestmark = pytest.mark.timeout(30)


async def test_a_record_its_own_reader_refuses_is_never_registered() -> None:
    record = make_record()
    bad = replace(record, model_card=ModelCard("llama", context_length=True))
    with pytest.raises(InvalidInputError, match=r"model_card\.context_length must be int"):
        readable(bad)
    async with await open_store("memory://") as store:
        lease = await store.grant(10)
        with pytest.raises(InvalidInputError, match="its own reader refuses it"):
            await register(store, bad, lease)
        with pytest.raises(InvalidInputError, match="is not registered"):
            async with Registration(store, bad, ttl=10):
                pass
        assert await store.list("v1/workers") == ([], 0)
        readable(record)  # an honest one reads back as written


async def test_write_backs_are_paced_however_fast_the_record_is_spoiled() -> None:
    record = make_record()
    spoils = writebacks = 0
    async with (
        await open_store("memory://") as store,
        Registration(store, record, ttl=10) as registration,
        store.watch(record.key) as events,
    ):
        ours = registration.record.to_bytes()

        async def count() -> None:
            nonlocal writebacks
            async for event in events:
                if isinstance(event, Put) and event.entry.value == ours:
                    writebacks += 1

        counter = asyncio.ensure_future(count())
        stop = time.monotonic() + 1.5
        while time.monotonic() < stop:
            await store.put(record.key, b"not a record", lease=KEEP)
            spoils += 1
            await asyncio.sleep(0.001)
        await cancel_and_wait(counter)
    # The back-off's delays grow to its 2 s cap: a handful of write-backs, not hundreds.
    assert spoils > 100 and writebacks <= 12, (spoils, writebacks)
