"""Reading an OpenAI-compatible server's load from its Prometheus metrics.

One table per server kind, first match wins: vLLM's names first, then SGLang's and
llama.cpp's. A family's samples are summed over their labels (vLLM labels each engine of a
data-parallel server). What a server does not export stays unknown (None); the caller
falls back on its own count of the requests it forwards.

From vLLM's ``vllm:cache_config_info`` (an info gauge whose labels carry the cache
configuration) come the block size and the number of KV blocks for the model card.

The page is the upstream's to write, so ``parse`` takes any text: what the parser cannot
read, a figure that is not a finite number at least 0 (``NaN``, ``+Inf``, ``-1``), or a
count past ``MAX_FIGURE`` is refused with one ``InvalidInputError`` naming the metric and
the value; nothing else escapes it. A label that is not a plain decimal (``"²"``, ``"1e3"``)
counts as absent. The figures it returns are finite.
"""

from __future__ import annotations

import math
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
MAX_FIGURE = 2**40
"""The largest count (requests, blocks, tokens) a page may report; more is nonsense."""


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
    parse as the Prometheus text format or a figure it reads is not a sane number (the
    module docstring)."""
    try:
        families = {f.name: f for f in text_string_to_metric_families(text)}
        sums: dict[str, float] = {}
        for family in families.values():
            for sample in family.samples:
                sums[sample.name] = sums.get(sample.name, 0.0) + float(sample.value)
    except Exception as exc:  # noqa: BLE001 - a third-party parser fed the upstream's text
        raise InvalidInputError(f"the upstream's metrics do not parse: {exc}") from None
    block_size, num_blocks = _cache_info(families.get(CACHE_INFO))
    for names in TABLES:
        running, waiting = _count(sums, names.running), _count(sums, names.waiting)
        if running is not None and waiting is not None:
            usage = _figure(sums, names.kv_usage)
            return Scraped(
                kind=names.kind,
                running=running,
                waiting=waiting,
                # a fraction; a server that rounds past 1 is full, not broken
                kv_usage=min(usage, 1.0) if usage is not None else 0.0,
                prefix_cache_hits=_count(sums, names.prefix_hits) or 0,
                prefix_cache_queries=_count(sums, names.prefix_queries) or 0,
                block_size=block_size,
                num_blocks=num_blocks,
            )
    return Scraped(block_size=block_size, num_blocks=num_blocks)


def _figure(sums: dict[str, float], name: str | None) -> float | None:
    """A gauge by its name, a counter by its name or its ``_total`` sample; refused when it
    is not a finite number from 0 to ``MAX_FIGURE``."""
    if name is None:
        return None
    name = name if name in sums else f"{name}_total"
    found = sums.get(name)
    if found is None:
        return None
    if not (math.isfinite(found) and 0 <= found <= MAX_FIGURE):
        raise InvalidInputError(
            f"the upstream's metric {name} is {found!r}; a finite number from 0 to "
            f"{MAX_FIGURE} was expected"
        )
    return found


def _count(sums: dict[str, float], name: str | None) -> int | None:
    found = _figure(sums, name)
    return None if found is None else int(found)


def _cache_info(family: object) -> tuple[int | None, int | None]:
    samples: Iterable[object] = getattr(family, "samples", ())
    for sample in samples:
        labels = getattr(sample, "labels", {})
        return _int(labels.get("block_size")), _int(labels.get("num_gpu_blocks"))
    return None, None


def _int(text: object) -> int | None:
    """A label holding a plain decimal from 1 to ``MAX_FIGURE``; else None (absent)."""
    if not isinstance(text, str) or not (text.isascii() and text.isdigit()) or len(text) > 15:
        return None
    value = int(text)
    return value if 0 < value <= MAX_FIGURE else None
