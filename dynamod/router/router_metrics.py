"""The router's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_DECISION_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.1)
_WAIT_BUCKETS = (0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class RouterMetrics:
    """The router's Prometheus series, on the registry it is given."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            "dynamod_router_decisions",
            "Routing decisions by model and outcome: routed (at once), dispatched (after "
            "waiting), no_worker, queue_full, timeout, shutdown, cancelled.",
            ["model", "outcome"],
            registry=registry,
        )
        self.latency = Histogram(
            "dynamod_router_decision_seconds",
            "Time to compute one routing decision: eligibility, scoring and selection.",
            buckets=_DECISION_BUCKETS,
            registry=registry,
        )
        self.depth = Gauge(
            "dynamod_router_queue_depth",
            "Requests waiting for a worker, by model.",
            ["model"],
            registry=registry,
        )
        self.wait = Histogram(
            "dynamod_router_queue_wait_seconds",
            "Seconds requests waited for a worker, by how the wait ended.",
            ["outcome"],
            buckets=_WAIT_BUCKETS,
            registry=registry,
        )
        self.disagreeing = Gauge(
            "dynamod_router_disagreeing_workers",
            "Workers left out of routing because they read requests otherwise (tokenizer, "
            "KV block size, body checks) than most workers of their model, by model.",
            ["model"],
            registry=registry,
        )
        self._decided: dict[tuple[str, str], Counter] = {}

    def decided(self, model: str, outcome: str, seconds: float | None = None) -> None:
        counter = self._decided.get((model, outcome))
        if counter is None:
            # labels() takes a lock and builds a key on every call: once per series is enough.
            counter = self._decided[model, outcome] = self.decisions.labels(model, outcome)
        counter.inc()
        if seconds is not None:
            self.latency.observe(seconds)

    def depth_changed(self, model: str, depth: int) -> None:
        self.depth.labels(model=model).set(depth)
