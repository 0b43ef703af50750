"""dynamod's own metrics (the router and the front register theirs on the same registry).

``dynamod_taint_updates_total{outcome}`` counts taint changes through the API;
``dynamod_taint_propagation_seconds`` is the time from such a change being written to the
store to this daemon's view applying it: the watch lag, measured on every write this
daemon makes (a store event carries no commit time, so other writers' lag cannot be
known without polling); ``dynamod_view_events_total{kind}`` counts events by kind,
resyncs included; ``dynamod_view_revision`` is the store revision the view has reached;
``dynamod_store_errors_total{operation}`` counts calls that failed on an unavailable
store (every API method's series starts at 0: ``known_operations``);
``dynamod_audit_failures_total`` counts audit lines that could not be written;
``dynamod_dynamo_records_refused_total{kind}`` counts an NVIDIA Dynamo fleet's records
(``card``, ``instance``) left out because their shape is not understood, once each;
``dynamod_dynamo_taint_warnings_total`` the warnings about the taints its workers hold
that dynamod would not set (a hand-set cordon Dynamo does not honour, a taint its grammar
refuses), once per card revision and taint; ``dynamod_memory_held_bytes`` and
``dynamod_memory_limit_bytes`` what the daemon holds of its peers' bytes and its
``memory_budget_mb``, ``dynamod_memory_refusals_total`` the holders it made pay
(``http/memory.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dynamod.discovery_events import (
    DiscoveryEvent,
    ViewResync,
    WorkerAdded,
    WorkerModified,
    WorkerRemoved,
)
from dynamod.http.memory import MemoryBudget

_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)
_KINDS = {
    WorkerAdded: "added",
    WorkerRemoved: "removed",
    WorkerModified: "taints",
    ViewResync: "resync",
}


class DaemonMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.taint_updates = Counter(
            "dynamod_taint_updates", "Taint changes through the API, by outcome.", ["outcome"],
            registry=registry,
        )  # fmt: skip
        self.propagation = Histogram(
            "dynamod_taint_propagation_seconds",
            "From a taint change written by this daemon to its view applying it.",
            buckets=_BUCKETS,
            registry=registry,
        )
        self.events = Counter(
            "dynamod_view_events", "Discovery events applied to the view, by kind.", ["kind"],
            registry=registry,
        )  # fmt: skip
        self.revision = Gauge(
            "dynamod_view_revision",
            "Store revision the worker view has reached.",
            registry=registry,
        )
        self.store_errors = Counter(
            "dynamod_store_errors",
            "API calls that failed because the store was unavailable, by method.",
            ["operation"],
            registry=registry,
        )
        self.audit_failures = Counter(
            "dynamod_audit_failures",
            "Audit lines that could not be written (the changes they describe were made).",
            registry=registry,
        )
        self.dynamo_refused = Counter(
            "dynamod_dynamo_records_refused",
            "A Dynamo fleet's records left out because their shape is not understood, by kind.",
            ["kind"],
            registry=registry,
        )
        self.dynamo_taint_warnings = Counter(
            "dynamod_dynamo_taint_warnings",
            "Taints a Dynamo fleet's workers hold that dynamod would not set, as warned of.",
            registry=registry,
        )
        self.memory_refusals = Counter(
            "dynamod_memory_refusals",
            "Holders of peers' bytes refused past the memory budget (the largest first).",
            registry=registry,
        )
        self._registry = registry
        self._written: dict[str, tuple[int, float]] = {}

    def follow_memory(self, budget: MemoryBudget) -> None:
        """The memory budget's bytes held and its limit, read at each scrape."""
        Gauge(
            "dynamod_memory_held_bytes",
            "Bytes of peers' answers, streams and tokenizer bundles the daemon holds.",
            registry=self._registry,
        ).set_function(lambda: budget.held)
        Gauge(
            "dynamod_memory_limit_bytes", "The daemon's memory budget (memory_budget_mb).",
            registry=self._registry,
        ).set_function(lambda: budget.limit)  # fmt: skip

    def known_operations(self, methods: Iterable[str]) -> None:
        """Start ``store_errors`` at 0 for every API method: a series born at its first
        error would hide that error from ``rate()`` and ``increase()`` (and from the
        DynamodStoreErrors alert), which see only growth between two scrapes."""
        for method in methods:
            self.store_errors.labels(method)

    def refused_dynamo_record(self, kind: str) -> None:
        self.dynamo_refused.labels(kind).inc()

    def wrote(self, key: str, revision: int) -> None:
        """A taint change of ``key`` was stored at ``revision``; time its arrival."""
        self._written[key] = (revision, time.perf_counter())

    def on_event(self, event: DiscoveryEvent) -> None:
        self.events.labels(_KINDS[type(event)]).inc()
        self.revision.set(event.revision)
        if isinstance(event, WorkerModified):
            self._arrived(event.record.key, event.revision)
        elif isinstance(event, ViewResync):
            for record in event.records:
                self._arrived(record.key, event.revision)

    def _arrived(self, key: str, revision: int) -> None:
        written = self._written.get(key)
        if written is not None and revision >= written[0]:
            del self._written[key]
            self.propagation.observe(time.perf_counter() - written[1])
