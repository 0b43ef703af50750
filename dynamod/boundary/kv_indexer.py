"""Folding the KV cache events workers forward into the router's ``KvIndex``.

``EngineStreams`` calls ``KvIndexer.connected(record)`` when a worker's stream delivers its first KV
line (the whole cache follows: the index of that worker starts empty), ``batch(key,
batch)`` for every KV line, and ``gone(key)`` when the stream ends or breaks (the worker
falls back on approximate overlap until a new connection rebuilds it).

Metrics: ``dynamod_kv_event_lag_seconds`` (engine publishing a batch → this daemon's index
holding it, on the worker's and the daemon's wall clocks: one machine, or synchronized
ones), ``dynamod_kv_blocks`` (blocks indexed, all workers), ``dynamod_kv_blocks_bound``
(the most the index keeps, all workers: ``KvIndex.total``; 0: no bound),
``dynamod_kv_workers`` (workers whose overlap comes from their KV events),
``dynamod_kv_dropped_blocks_total`` (stored blocks not indexed: parent unknown, or over a
worker's limit), ``dynamod_kv_evicted_blocks_total`` (blocks pushed out because the whole
index was at its bound: from the worker holding the most beyond its share).
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dynamod.kv_events import KvBatch
from dynamod.records import WorkerRecord
from dynamod.router.kvindex import KvIndex

LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class KvIndexer:
    """The daemon's side of KV-aware routing; see the module docstring."""

    def __init__(self, index: KvIndex, per_worker: int, registry: CollectorRegistry) -> None:
        self.index = index
        self._per_worker = per_worker
        self._lag = Histogram(
            "dynamod_kv_event_lag_seconds",
            "From an engine publishing KV events to this daemon's index holding them.",
            buckets=LAG_BUCKETS,
            registry=registry,
        )
        blocks = Gauge("dynamod_kv_blocks", "KV blocks indexed, all workers.", registry=registry)
        blocks.set_function(lambda: len(index))
        workers = Gauge(
            "dynamod_kv_workers",
            "Workers whose prefix overlap comes from their engine's KV events.",
            registry=registry,
        )
        workers.set_function(lambda: index.workers)
        bound = Gauge(
            "dynamod_kv_blocks_bound",
            "KV blocks the index keeps at most, all workers (0: no bound).",
            registry=registry,
        )
        bound.set(index.total)
        self._dropped = Counter(
            "dynamod_kv_dropped_blocks",
            "Stored KV blocks not indexed: parent unknown, or over a worker's limit.",
            registry=registry,
        )
        self._evicted = Counter(
            "dynamod_kv_evicted_blocks",
            "KV blocks forgotten because the whole index was at its bound.",
            registry=registry,
        )

    def limit(self, record: WorkerRecord) -> int:
        """The most blocks indexed for ``record``'s worker: the router's limit, or its
        engine's KV cache when smaller (an engine holds no more than that)."""
        engine = record.model_card.total_kv_blocks
        return min(self._per_worker, engine) if engine > 0 else self._per_worker

    def connected(self, record: WorkerRecord) -> None:
        self.index.attach(record.key, self.limit(record))

    def batch(self, key: str, batch: KvBatch) -> None:
        index = self.index
        dropped, evicted = index.dropped, index.evicted
        index.apply(key, batch.events)
        self._lag.observe(max(0.0, time.time() - batch.ts))
        if index.dropped > dropped:
            self._dropped.inc(index.dropped - dropped)
        if index.evicted > evicted:
            self._evicted.inc(index.evicted - evicted)

    def gone(self, key: str) -> None:
        self.index.detach(key)
