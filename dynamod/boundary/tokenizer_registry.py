"""The daemon's tokenizers: each model's own, fetched from its workers and cached.

``for_card(card)`` gives the tokenizer a model card names (``tokenizers.bundle``): from the
cache (by checksum, the ``capacity`` most recently used), or fetched from the system
address of a worker of that model whose card names the same checksum, verified, and
built. Concurrent callers for one checksum share one fetch; a caller that is cancelled
leaves the fetch to the next. When none can be had (no worker answers, the bundle fails
its checksum, the ``hf`` extra is missing), the caller gets the approximate
``SimpleTokenizer`` and the failure is logged; it is tried again ``retry_after`` seconds
later. A card that names no tokenizer (an older worker) gets ``SimpleTokenizer`` at once,
as every model did before workers published theirs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from types import TracebackType
from typing import Self

import aiohttp

from dynamod.discovery.view import WorkerView
from dynamod.records import ModelCard, WorkerRecord
from dynamod.tokenizers import SimpleTokenizer, Tokenizer
from dynamod.tokenizers.bundle import TokenizerRef, TokenizerUnavailableError, load

log = logging.getLogger(__name__)

CAPACITY = 32
FETCH_TIMEOUT = 5.0
REFETCH_AFTER = 30.0
SOURCES_TRIED = 3
"""Workers tried, one after the other, for one fetch."""


class TokenizerRegistry:
    """Each model's tokenizer for the front and ``explain``; see the module docstring.

    An async context manager: it owns the HTTP session its fetches use.
    """

    def __init__(
        self,
        view: WorkerView,
        *,
        capacity: int = CAPACITY,
        fetch_timeout: float = FETCH_TIMEOUT,
        retry_after: float = REFETCH_AFTER,
    ) -> None:
        self._view = view
        self._capacity = capacity
        self._timeout = aiohttp.ClientTimeout(total=fetch_timeout)
        self._retry_after = retry_after
        self._cache: OrderedDict[str, Tokenizer] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self._failed: dict[str, float] = {}
        self._approximate = SimpleTokenizer()
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()

    def cached(self, checksum: str) -> Tokenizer | None:
        return self._cache.get(checksum)

    async def for_card(self, card: ModelCard) -> Tokenizer:
        ref = TokenizerRef.of(card)
        if ref is None:
            return self._approximate
        found = self._hit(ref.checksum)
        if found is not None:
            return found
        if time.monotonic() < self._failed.get(ref.checksum, 0.0):
            return self._approximate
        lock = self._locks.setdefault(ref.checksum, asyncio.Lock())
        async with lock:
            found = self._hit(ref.checksum)  # fetched while this caller waited
            if found is None:
                found = await self._fetch(card.name, ref)
        if not lock.locked():
            self._locks.pop(ref.checksum, None)
        return found

    def _hit(self, checksum: str) -> Tokenizer | None:
        found = self._cache.get(checksum)
        if found is not None:
            self._cache.move_to_end(checksum)
        return found

    async def _fetch(self, model: str, ref: TokenizerRef) -> Tokenizer:
        sources = [r for r in self._view.records() if _publishes(r, model, ref)][:SOURCES_TRIED]
        errors = []
        for record in sources:
            try:
                tokenizer = await self._fetch_from(record, ref)
            except (aiohttp.ClientError, TimeoutError, TokenizerUnavailableError) as exc:
                errors.append(f"{record.instance_id}: {exc or type(exc).__name__}")
                continue
            self._remember(ref.checksum, tokenizer)
            log.info("tokenizer of model %r (%s) fetched from %s", model, ref.kind, record.address)
            return tokenizer
        self._failed[ref.checksum] = time.monotonic() + self._retry_after
        why = "; ".join(errors) or "no worker of the model publishes it now"
        log.warning(
            "tokenizer %s of model %r cannot be had (%s); routing it with an approximate "
            "tokenizer for %gs",
            ref.checksum[:19], model, why, self._retry_after,
        )  # fmt: skip
        return self._approximate

    async def _fetch_from(self, record: WorkerRecord, ref: TokenizerRef) -> Tokenizer:
        if self._session is None:
            raise RuntimeError("use TokenizerRegistry in 'async with' before fetching")
        url = record.system_address.rstrip("/") + ref.path
        async with self._session.get(url, raise_for_status=True) as response:
            raw = await response.read()
        # Building a large Hugging Face tokenizer takes tens of milliseconds: off the loop.
        return await asyncio.to_thread(load, raw, ref.checksum)

    def _remember(self, checksum: str, tokenizer: Tokenizer) -> None:
        self._cache[checksum] = tokenizer
        self._failed.pop(checksum, None)
        while len(self._cache) > self._capacity:
            self._cache.popitem(last=False)


def _publishes(record: WorkerRecord, model: str, ref: TokenizerRef) -> bool:
    return (
        record.model == model
        and bool(record.system_address)
        and TokenizerRef.of(record.model_card) == ref
    )
