"""KV events are budgeted by count as well as by bytes and lines (issue 28): tiny
single-block events, inside the byte and line budgets, are refused as too fast once a
worker spends its KV event burst faster than the rate refills it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from dynamod.boundary import Budgets, KvIndexer
from dynamod.boundary.breaches import kind_of
from dynamod.boundary.budgets import RateBudget, TooFastError
from dynamod.boundary.engine_streams import worker_budgets
from dynamod.engine_events import RECORD_FIELD, offer
from dynamod.kv_events import BlockRemoved, KvBatch
from dynamod.records import ModelCard
from dynamod.router.kvindex import KvIndex
from tests.daemon.test_events_stream import read_all, serving, streaming
from tests.hostile_workers.events_fakes import SNAPSHOT, line
from tests.support.factories import make_record

EVENTS_A_LINE = 500


def kv_line(seq: int) -> bytes:
    batch = KvBatch(tuple(BlockRemoved((i,)) for i in range(EVENTS_A_LINE)), 1.0)
    return line(batch.to_json(seq))


async def test_tiny_kv_events_within_the_byte_budget_are_refused_past_the_count() -> None:
    budgets = Budgets(kv_events_burst=1000, kv_events_per_second=1, stall=2)
    lines = [kv_line(seq) for seq in range(5)]
    assert sum(map(len, lines)) < budgets.bytes_burst and len(lines) < budgets.events_burst
    got: list[object] = []
    async with serving(streaming(line(SNAPSHOT), *lines)) as url:
        with pytest.raises(TooFastError) as refused:
            await read_all(url, budgets, got)  # type: ignore[arg-type]
    assert kind_of(refused.value).name == "TOO_FAST"
    assert "more than 1000 KV events at once" in str(refused.value)
    assert len(got) == 1 + 2  # the snapshot, then two lines of 500 within the burst


def test_the_kv_event_bucket_refills_at_its_rate() -> None:
    now = [0.0]
    rate = RateBudget(Budgets(kv_events_burst=10, kv_events_per_second=5), clock=lambda: now[0])
    rate.spend_kv(10)
    with pytest.raises(TooFastError):
        rate.spend_kv(1)
    now[0] = 1.0
    rate.spend_kv(5)
    with pytest.raises(TooFastError):
        rate.spend_kv(1)


def test_a_worker_offering_kv_events_gets_a_kv_event_burst_for_its_whole_snapshot() -> None:
    """A reconnecting engine's snapshot may name each of its blocks in an event of its own:
    the burst takes as many events as the daemon indexes blocks for it."""
    kv = KvIndexer(KvIndex(), 1 << 20, CollectorRegistry())
    card = ModelCard("llama", kv_block_size=16, total_kv_blocks=500_000)
    offering = replace(make_record(), model_card=card, extra={RECORD_FIELD: offer(kv=True)})
    offering = replace(offering, system_address="http://127.0.0.1:1")
    assert worker_budgets(Budgets(), offering, kv).kv_events_burst == 500_000
    assert worker_budgets(Budgets(), make_record(), kv).kv_events_burst == Budgets().kv_events_burst
