"""A Prometheus ``/metrics`` page read as numbers, for the tests and benchmarks that check
a daemon's counters."""

from __future__ import annotations

import aiohttp


async def scrape(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Every sample at ``url``: ``name{labels}`` → its value."""
    async with http.get(url) as response:
        text = await response.text()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found
