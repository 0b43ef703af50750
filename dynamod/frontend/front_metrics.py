"""The front's Prometheus series, on the registry it is given."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

CLIENT_CLOSED = 499
"""The status counted for a request whose client went away before its answer (nginx's)."""

_FIRST_BYTE_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


class FrontendMetrics:
    """Requests by route and status, time to first byte, retries, worker failures,
    requests in flight."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "dynamod_front_requests",
            "Inference requests answered by the front, by route and HTTP status "
            f"({CLIENT_CLOSED}: the client went away first).",
            ["route", "status"],
            registry=registry,
        )
        self.first_byte = Histogram(
            "dynamod_front_first_byte_seconds",
            "Seconds from a request's arrival to the first byte of its answer from a worker: "
            "the first event of a stream, or the whole response otherwise.",
            ["route"],
            buckets=_FIRST_BYTE_BUCKETS,
            registry=registry,
        )
        self.retries = Counter(
            "dynamod_front_retries",
            "Retries: requests routed again, the failed worker excluded, after a worker "
            "failed before its first byte (counted even when no other worker can take the "
            "request), by reason: unreachable, timeout, status (a 5xx answer).",
            ["reason"],
            registry=registry,
        )
        self.worker_failures = Counter(
            "dynamod_front_worker_failures",
            "Failures of workers' answers, before or after the client's answer started, by "
            "reason: unreachable, timeout, status (a 5xx answer), oversize (an answer or an "
            "SSE event over the front's limits), broken (an answer cut off).",
            ["reason"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "dynamod_front_inflight_requests",
            "Inference requests the front is handling now.",
            registry=registry,
        )
        # labels() takes a lock and builds a key at every call: once per series is enough
        # (a few routes and statuses), as the router's decisions do.
        self._answered: dict[tuple[str, int], Counter] = {}
        self._first_bytes: dict[str, Histogram] = {}

    def answered(self, route: str, status: int) -> None:
        counter = self._answered.get((route, status))
        if counter is None:
            counter = self._answered[route, status] = self.requests.labels(route, str(status))
        counter.inc()

    def first_byte_after(self, route: str, seconds: float) -> None:
        """A request of ``route`` got its answer's first byte ``seconds`` after it arrived."""
        histogram = self._first_bytes.get(route)
        if histogram is None:
            histogram = self._first_bytes[route] = self.first_byte.labels(route)
        histogram.observe(seconds)
