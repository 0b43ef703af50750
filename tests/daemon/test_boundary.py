"""The worker boundary's pieces on their own: the rate budget, the marks a breach leaves,
the KV index's global bound and who pays for it, the engine state's refusal of what the
API cannot carry (in both directions), and which KV publishers an upstream may name."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from dynamod import settings as daemon_settings
from dynamod.boundary import Breach, Breaches, BreachKind, Budgets, RateBudget, TooFastError
from dynamod.boundary.breaches import kind_of
from dynamod.boundary.engine_streams import worker_budgets
from dynamod.boundary.kv_indexer import KvIndexer
from dynamod.engine_events import MAX_REASON, RECORD_FIELD, EngineLoad, offer
from dynamod.errors import ConfigError, InvalidInputError, OversizeError
from dynamod.kv_events import BlockStored
from dynamod.records import ModelCard
from dynamod.router.kvindex import KvIndex
from dynamod.tokenizers import SimpleTokenizer
from dynamod.worker.engines.base import Changes, EngineStats
from dynamod.worker.engines.kv_sources import followable
from dynamod.worker.publish import EnginePublisher
from tests.support.factories import make_record


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_rate_budget_allows_its_burst_then_only_its_rate() -> None:
    clock = Clock()
    rate = RateBudget(Budgets(events_per_second=10, events_burst=50), clock)
    for _ in range(50):
        rate.spend(100)
    with pytest.raises(TooFastError, match="more than 50 events at once"):
        rate.spend(100)
    clock.now += 1.0  # ten more
    for _ in range(10):
        rate.spend(100)
    with pytest.raises(TooFastError):
        rate.spend(100)
    clock.now += 60.0  # refilled, never past the burst
    for _ in range(50):
        rate.spend(100)
    with pytest.raises(TooFastError):
        rate.spend(100)


def test_a_rate_budget_counts_bytes_as_well_as_lines() -> None:
    clock = Clock()
    budgets = Budgets(bytes_per_second=1 << 20, bytes_burst=4 << 20, line=1 << 16)
    rate = RateBudget(budgets, clock)
    for _ in range(64):
        rate.spend(1 << 16)  # 4 MiB: the whole burst
    with pytest.raises(TooFastError, match="bytes at once"):
        rate.spend(1)
    clock.now += 0.5
    rate.spend(512 << 10)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"events_per_second": 0}, "events_per_second must be a number above 0"),
        ({"stall": math.inf}, "stall must be a number above 0"),
        ({"bytes_burst": 100}, "must hold at least one line"),
    ],
)
def test_budgets_are_checked(change: dict[str, float], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        Budgets(**change)  # type: ignore[arg-type]


def test_an_exception_names_the_breach_it_stands_for() -> None:
    assert kind_of(OversizeError("a line", 10)) is BreachKind.OVERSIZE
    assert kind_of(TooFastError("fast")) is BreachKind.TOO_FAST
    assert kind_of(TimeoutError()) is BreachKind.TIMEOUT
    assert kind_of(InvalidInputError("bad")) is BreachKind.MALFORMED
    assert kind_of(KeyError("anything else")) is BreachKind.MALFORMED


def test_a_marked_worker_is_unhealthy_until_it_makes_progress() -> None:
    heard: list[tuple[str, EngineLoad | None]] = []
    breaches = Breaches(lambda key, load: heard.append((key, load)))
    breaches.report("w", EngineLoad(running=1))
    breaches.breach(Breach("w", BreachKind.TOO_FAST, "x" * 1000))
    mark = heard[-1][1]
    assert mark is not None and not mark.healthy and mark.source == "boundary"
    assert mark.reason.startswith("broke the daemon's boundary (too_fast): xxx")
    assert len(mark.reason) == MAX_REASON
    breaches.report("w", EngineLoad(running=2))  # held back
    breaches.report("w", None)  # a failed reconnect does not lift the mark
    assert len(heard) == 2 and len(breaches) == 1
    assert breaches.last("w") == Breach("w", BreachKind.TOO_FAST, "x" * 1000)
    breaches.clear("w")
    assert heard[-1:] == [("w", EngineLoad(running=2))] and breaches.last("w") is None
    breaches.breach(Breach("w", BreachKind.UNSTABLE, "ended"))
    breaches.forget("w")
    assert heard[-1:] == [("w", None)] and len(breaches) == 0


def stored(first: int, count: int) -> BlockStored:
    """``count`` new blocks of one token, engine hashes from ``first``."""
    hashes = tuple(range(first, first + count))
    return BlockStored(hashes, None, hashes, 1)


def test_the_index_bound_is_paid_by_the_worker_holding_the_most_beyond_its_share() -> None:
    index = KvIndex(total=1000)
    for worker in ("honest", "flood-1", "flood-2"):
        index.attach(worker, limit=1 << 20)
    index.apply("honest", [stored(0, 100)])
    index.apply("flood-1", [stored(10_000, 5000)])
    assert len(index) == 1000 and index.blocks("honest") == 100
    assert index.blocks("flood-1") == 900 and index.evicted == 4100
    index.apply("flood-2", [stored(20_000, 600)])  # below its share (333) first, then over
    assert len(index) == 1000 and index.blocks("honest") == 100
    assert index.blocks("flood-2") >= 333 and index.blocks("flood-1") >= 333
    index.apply("honest", [stored(30_000, 100)])  # within its share: the floods pay
    assert index.blocks("honest") == 200 and len(index) == 1000
    index.detach("flood-1")
    assert len(index) == index.blocks("honest") + index.blocks("flood-2") < 1000


def test_an_unbounded_index_counts_what_it_holds() -> None:
    index = KvIndex()
    index.attach("a", limit=10)
    index.apply("a", [stored(0, 25)])
    assert len(index) == 10 and index.dropped == 15 and index.evicted == 0
    index.detach("a")
    assert len(index) == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kv_usage": math.inf}, "'kv_usage' must be a finite number"),
        ({"kv_usage": math.nan}, "'kv_usage' must be a finite number"),
        ({"running": -1}, "'running' must be from 0 to 2147483647"),
        ({"waiting": 1 << 31}, "'waiting' must be from 0"),
        ({"prefix_cache_hits": 1 << 63}, "'prefix_cache_hits' must be from 0"),
        ({"reason": "\udc00"}, "'reason' is not valid UTF-8"),
        ({"source": "s" * 65}, "'source' must be at most 64 characters"),
    ],
)
def test_an_engine_state_the_api_could_not_carry_is_refused(
    change: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        EngineLoad(**change)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=message.split(" must")[0]):
        EngineLoad.from_json(change)


def test_a_state_read_from_the_wire_is_clamped_or_refused() -> None:
    assert EngineLoad(kv_usage=1.25).kv_usage == 1.0
    assert EngineLoad.from_json({"kv_usage": -0.5}).kv_usage == 0.0
    assert len(EngineLoad.from_json({"reason": "r" * 10_000}).reason) == MAX_REASON
    for raw in ('{"kv_usage": Infinity}', '{"kv_usage": 1e400}', f'{{"kv_usage": {10**400}}}'):
        with pytest.raises(InvalidInputError, match="must be a finite float"):
            EngineLoad.from_json(json.loads(raw))


class BrokenStats:
    """An engine whose stats cannot be read: ``+Inf`` KV usage times its blocks."""

    kv_events = None

    def __init__(self) -> None:
        self.changes = Changes()
        self.tokenizer = SimpleTokenizer()

    def stats(self) -> EngineStats:
        return EngineStats(0, 0, round(math.inf * 0), 0)


def test_a_worker_whose_engine_stats_break_reports_an_unhealthy_state() -> None:
    publisher = EnginePublisher(BrokenStats())  # type: ignore[arg-type]
    state = publisher.state()
    assert not state.healthy and "its engine's stats are not a load" in state.reason
    assert json.loads(json.dumps(state.to_json(), allow_nan=False)) == state.to_json()


@pytest.mark.parametrize(
    ("endpoint", "host"),
    [
        ("tcp://10.0.0.5:5557", "10.0.0.5"),
        ("tcp://127.0.0.1:5557", "10.0.0.5"),
        ("tcp://[::1]:5557", "vllm.internal"),
        ("ipc:///tmp/kv", "localhost"),
    ],
)
def test_an_upstream_may_name_its_own_host_or_loopback(endpoint: str, host: str) -> None:
    assert followable(endpoint, host) == endpoint


@pytest.mark.parametrize(
    ("endpoint", "host", "message"),
    [
        ("tcp://10.9.9.9:5557", "10.0.0.5", "neither the upstream's"),
        ("tcp://metadata.internal:80", "10.0.0.5", "neither the upstream's"),
        ("ipc:///run/other.sock", "10.0.0.5", "is not on this machine"),
        ("inproc://kv", "127.0.0.1", "is not tcp://HOST:PORT"),
        ("pgm://eth0;239.0.0.1:5555", "127.0.0.1", "is not tcp://HOST:PORT"),
        ("tcp://eth0;10.0.0.5:5557", "10.0.0.5", "is not tcp://HOST:PORT"),
        ("tcp://10.0.0.5", "10.0.0.5", "names no port"),
    ],
)
def test_an_upstream_may_not_send_the_worker_elsewhere(
    endpoint: str, host: str, message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        followable(endpoint, host)


def test_the_boundary_settings_come_from_the_environment_and_are_checked(
    tmp_path: Path,
) -> None:
    path = tmp_path / "dynamod.toml"
    path.write_text("worker_events_burst = 20\n")
    environ = {"DYNAMO_KV_BLOCKS_TOTAL": "5000", "DYNAMO_WORKER_EVENTS_PER_SECOND": "50"}
    settings = daemon_settings.load(path=path, environ=environ)
    assert settings.kv_blocks_total == 5000 and settings.worker_events_per_second == 50.0
    assert settings.worker_events_burst == 20
    with pytest.raises(ConfigError, match="kv_blocks_total must be >= 0"):
        daemon_settings.load(path=path, environ={"DYNAMO_KV_BLOCKS_TOTAL": "-1"})
    with pytest.raises(ConfigError, match="worker_event_bytes_burst must be at least one line"):
        daemon_settings.load(path=path, environ={"DYNAMO_WORKER_EVENT_BYTES_BURST": "10"})


def test_a_worker_offering_kv_events_gets_a_burst_for_its_whole_snapshot() -> None:
    """A large engine reconnecting sends its whole cache at once: as many blocks as the
    daemon indexes for it, which is no flood; a worker without KV events keeps the burst."""
    kv = KvIndexer(KvIndex(), 1 << 20, CollectorRegistry())
    card = ModelCard("llama", kv_block_size=16, total_kv_blocks=500_000)
    plain = make_record()
    offering = replace(plain, model_card=card, extra={RECORD_FIELD: offer(kv=True)})
    offering = replace(offering, system_address="http://127.0.0.1:1")
    budgets = Budgets()
    assert worker_budgets(budgets, plain, kv) == budgets
    assert worker_budgets(budgets, offering, None) == budgets
    assert worker_budgets(budgets, offering, kv).bytes_burst == 500_000 * (24 + 8 * 16)
    huge = replace(offering, model_card=replace(card, kv_block_size=1 << 20))
    assert worker_budgets(budgets, huge, kv).bytes_burst == 500_000 * (24 + 8 * 64)


def test_a_breach_quoting_what_is_not_utf_8_still_marks_its_worker() -> None:
    heard: list[EngineLoad | None] = []
    Breaches(lambda key, load: heard.append(load)).breach(
        Breach("w", BreachKind.MALFORMED, "a line from http://h\udc00/ is bad")
    )
    assert heard[0] is not None and "h\\udc00/" in heard[0].reason
