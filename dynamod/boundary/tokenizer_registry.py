"""The daemon's tokenizers: each model's own, fetched from its workers and cached.

``for_card(card)`` gives the tokenizer a model card names (``tokenizers.bundle``): from the
cache (by checksum, the ``capacity`` most recently used, and at most ``cache_bytes`` of
their bundles), or fetched from the system address of a worker of that model whose card
names the same checksum. Concurrent callers for one checksum share one fetch; a caller
that is cancelled leaves the fetch to the next.

A worker is untrusted, and so is what it sends. The bundle is read through the one
bounded reader (``http.bounded.read_body``), at most ``bundle_bytes``, and held until it is
checked on a claim of the daemon's memory budget (``memory``: ``http.memory``, shared with
the front's answers), so that many fetches at once stay within it; its bytes are hashed
against the card's checksum in a thread (hashing releases the GIL); a model's own
(Hugging Face) tokenizer is never built in the daemon's process: ``check`` builds it in a
prompt process (``PromptProcesses.check_tokenizer``, within its CPU and memory bounds) and
the cache keeps only its bytes (``tokenizers.bundle.BundledTokenizer``), which the prompt
processes run. Without ``check`` (tools, tests) it is built in a thread here.

When none can be had (no worker answers, the bundle is too large, fails its checksum or
does not build, the ``hf`` extra is missing, the memory budget made the fetch pay: then
no other worker is asked), the caller gets the approximate
``SimpleTokenizer``: the model's requests are still served, but their token counts and KV
block hashes are the mocker's, so prefix-aware routing and context checks are approximate
for them. The failure is logged once (a warning; the attempts after it at debug level) and
tried again after a delay of the one back-off (``dynamod.backoff.Backoff``: ``retry_after``
growing to ``RETRY_CAP``), so a worker serving a bad bundle is not asked again on every
request. A card that names no tokenizer (an older worker) gets ``SimpleTokenizer`` at once,
as every model did before workers published theirs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import aiohttp

from dynamod.backoff import Backoff
from dynamod.discovery.view import WorkerView
from dynamod.errors import MemoryBudgetError, PromptWorkerError, UpstreamError
from dynamod.http.bounded import read_body
from dynamod.http.memory import MemoryBudget
from dynamod.records import ModelCard, WorkerRecord
from dynamod.tokenizers import SimpleTokenizer, Tokenizer
from dynamod.tokenizers.bundle import (
    BundledTokenizer,
    TokenizerRef,
    TokenizerUnavailableError,
    load,
    received,
)
from dynamod.tokenizers.limits import TokenizerLimits

log = logging.getLogger(__name__)

CAPACITY = 32
FETCH_TIMEOUT = 5.0
REFETCH_AFTER = 30.0
RETRY_CAP = 600.0
"""The longest delay before a tokenizer that could not be had is tried again."""
FAILURES_KEPT = 1024
"""Checksums whose failure (and back-off) is remembered; the oldest is forgotten first."""
SOURCES_TRIED = 3
"""Workers tried, one after the other, for one fetch."""

BundleCheck = Callable[[bytes, str], Awaitable[None]]
"""Builds a bundle (its bytes, its checksum) where it is safe to, or raises
``TokenizerUnavailableError``: ``PromptProcesses.check_tokenizer``."""


@dataclass
class _Failure:
    backoff: Backoff
    until: float


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
        limits: TokenizerLimits | None = None,
        check: BundleCheck | None = None,
        memory: MemoryBudget | None = None,
    ) -> None:
        self._view = view
        self._memory = memory if memory is not None else MemoryBudget()
        self._capacity = capacity
        self._limits = limits if limits is not None else TokenizerLimits()
        self._check = check
        self._timeout = aiohttp.ClientTimeout(total=fetch_timeout)
        self._retry_after = retry_after
        self._cache: OrderedDict[str, tuple[Tokenizer, int]] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self._failed: OrderedDict[str, _Failure] = OrderedDict()
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
        held = self._cache.get(checksum)
        return held[0] if held is not None else None

    @property
    def cached_bytes(self) -> int:
        """Bytes of bundles the cache holds."""
        return sum(size for _, size in self._cache.values())

    async def for_card(self, card: ModelCard) -> Tokenizer:
        ref = TokenizerRef.of(card)
        if ref is None:
            return self._approximate
        found = self._hit(ref.checksum)
        if found is not None:
            return found
        failed = self._failed.get(ref.checksum)
        if failed is not None and time.monotonic() < failed.until:
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
        held = self._cache.get(checksum)
        if held is None:
            return None
        self._cache.move_to_end(checksum)
        return held[0]

    async def _fetch(self, model: str, ref: TokenizerRef) -> Tokenizer:
        sources = [r for r in self._view.records() if _publishes(r, model, ref)][:SOURCES_TRIED]
        errors = []
        for record in sources:
            try:
                tokenizer, size = await self._fetch_from(record, model, ref)
            except MemoryBudgetError as exc:  # the daemon's, not the worker's: none is tried
                errors.append(str(exc))
                break
            except (
                aiohttp.ClientError,
                TimeoutError,
                UpstreamError,
                TokenizerUnavailableError,
                PromptWorkerError,
            ) as exc:
                errors.append(f"{record.instance_id}: {exc or type(exc).__name__}")
                continue
            self._remember(ref.checksum, tokenizer, size)
            log.info("tokenizer of model %r (%s) fetched from %s", model, ref.kind, record.address)
            return tokenizer
        self._failure(model, ref, "; ".join(errors) or "no worker of the model publishes it now")
        return self._approximate

    async def _fetch_from(
        self, record: WorkerRecord, model: str, ref: TokenizerRef
    ) -> tuple[Tokenizer, int]:
        """The tokenizer ``record``'s worker serves, checked, and its bundle's size."""
        if self._session is None:
            raise RuntimeError("use TokenizerRegistry in 'async with' before fetching")
        url = record.system_address.rstrip("/") + ref.path
        what = f"the tokenizer bundle of model {model!r} from {url}"
        with self._memory.claim(what) as claim:
            async with self._session.get(url, raise_for_status=True) as response:
                raw = await read_body(response, self._limits.bundle_bytes, what, claim)
            tokenizer = await asyncio.to_thread(received, raw, ref)
            if isinstance(tokenizer, BundledTokenizer):
                await self._built(raw, ref.checksum)
            if claim.refused is not None:  # made to pay while it was checked
                raise claim.refused
        return tokenizer, len(raw) if isinstance(tokenizer, BundledTokenizer) else 0

    async def _built(self, raw: bytes, checksum: str) -> None:
        """Check that the bundle builds: in a prompt process, or here in a thread."""
        if self._check is not None:
            await self._check(raw, checksum)
        else:
            await asyncio.to_thread(load, raw, checksum, max_output=self._limits.max_output)

    def _failure(self, model: str, ref: TokenizerRef, why: str) -> None:
        failed = self._failed.pop(ref.checksum, None)
        if failed is None:
            failed = _Failure(Backoff(self._retry_after, max(RETRY_CAP, self._retry_after)), 0.0)
        delay = failed.backoff.delay()
        failed.until = time.monotonic() + delay
        self._failed[ref.checksum] = failed
        while len(self._failed) > FAILURES_KEPT:
            self._failed.popitem(last=False)
        level = logging.WARNING if failed.backoff.attempts == 1 else logging.DEBUG
        log.log(
            level,
            "tokenizer %s of model %r cannot be had (%s); routing it with an approximate "
            "tokenizer, trying again in %.0f s (attempt %d)",
            ref.checksum[:19], model, why, delay, failed.backoff.attempts,
        )  # fmt: skip

    def _remember(self, checksum: str, tokenizer: Tokenizer, size: int) -> None:
        self._cache[checksum] = (tokenizer, size)
        self._cache.move_to_end(checksum)
        self._failed.pop(checksum, None)
        while len(self._cache) > 1 and (
            len(self._cache) > self._capacity or self.cached_bytes > self._limits.cache_bytes
        ):
            self._cache.popitem(last=False)


def _publishes(record: WorkerRecord, model: str, ref: TokenizerRef) -> bool:
    return (
        record.model == model
        and bool(record.system_address)
        and TokenizerRef.of(record.model_card) == ref
    )
