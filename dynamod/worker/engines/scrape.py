"""Reading an OpenAI-compatible server's load from its Prometheus metrics.

One table per server kind, first match wins: vLLM's names first, then SGLang's and
llama.cpp's. A family's samples are summed over their labels (vLLM labels each engine of a
data-parallel server). What a server does not export stays unknown (None); the caller
falls back on its own count of the requests it forwards.

From vLLM's ``vllm:cache_config_info`` (an info gauge whose labels carry the cache
configuration) come the block size and the number of KV blocks for the model card.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from dynamod.errors import InvalidInputError


@dataclass(frozen=True)
class Names:
    """Which metric families say what, for one kind of server."""

    kind: str
    running: str
    waiting: str
    kv_usage: str | None = None
    prefix_hits: str | None = None
    prefix_queries: str | None = None


TABLES = (
    Names(
        "vllm",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_hits",
        "vllm:prefix_cache_queries",
    ),
    Names("sglang", "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"),
    Names(
        "llama.cpp",
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "llamacpp:kv_cache_usage_ratio",
    ),
)
CACHE_INFO = "vllm:cache_config_info"


@dataclass(frozen=True)
class Scraped:
    """One scrape's figures; ``kind`` None when no table matched."""

    kind: str | None = None
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    prefix_cache_hits: int = 0
    prefix_cache_queries: int = 0
    block_size: int | None = None
    num_blocks: int | None = None


def parse(text: str) -> Scraped:
    """The figures in a ``/metrics`` page; raises ``InvalidInputError`` when it does not
    parse as the Prometheus text format."""
    try:
        families = {f.name: f for f in text_string_to_metric_families(text)}
    except ValueError as exc:
        raise InvalidInputError(f"the upstream's metrics do not parse: {exc}") from None
    sums: dict[str, float] = {}
    for family in families.values():
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    block_size, num_blocks = _cache_info(families.get(CACHE_INFO))
    for names in TABLES:
        running, waiting = _value(sums, names.running), _value(sums, names.waiting)
        if running is not None and waiting is not None:
            return Scraped(
                kind=names.kind,
                running=int(running),
                waiting=int(waiting),
                kv_usage=_value(sums, names.kv_usage) or 0.0,
                prefix_cache_hits=int(_value(sums, names.prefix_hits) or 0),
                prefix_cache_queries=int(_value(sums, names.prefix_queries) or 0),
                block_size=block_size,
                num_blocks=num_blocks,
            )
    return Scraped(block_size=block_size, num_blocks=num_blocks)


def _value(sums: dict[str, float], name: str | None) -> float | None:
    """A gauge by its name, a counter by its name or its ``_total`` sample."""
    if name is None:
        return None
    found = sums.get(name)
    return found if found is not None else sums.get(f"{name}_total")


def _cache_info(family: object) -> tuple[int | None, int | None]:
    samples: Iterable[object] = getattr(family, "samples", ())
    for sample in samples:
        labels = getattr(sample, "labels", {})
        return _int(labels.get("block_size")), _int(labels.get("num_gpu_blocks"))
    return None, None


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None
