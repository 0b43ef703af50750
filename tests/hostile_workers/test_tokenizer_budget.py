"""Tokenizer fetches are bounded in total, not only each (issue 28: 8 models with 2 GB
bundles took the daemon to 1,068 MB): the bundles being fetched draw on the daemon's one
memory budget. In process, on a real bundle server: four models whose 3 MiB bundles are
all in flight at once (12 MiB) with a budget of 8 MiB; the fetch holding the most pays,
is logged naming the budget, its model routed approximately meanwhile, and fetched once
the others are done (the registry's own back-off)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial

import pytest
from aiohttp import web

from dynamod import jsoncodec
from dynamod.boundary import TokenizerRegistry
from dynamod.http.memory import MemoryBudget
from dynamod.tokenizers import SimpleTokenizer
from dynamod.tokenizers.bundle import BundledTokenizer
from dynamod.tokenizers.limits import MIB, TokenizerLimits
from tests.hostile_workers.template_fakes import FINE, tokenizer_json
from tests.hostile_workers.test_templates import card_of, checksum_of, view_of
from tests.support.eventually import eventually
from tests.support.web import Gate, served

pytestmark = pytest.mark.timeout(120)

MODELS = ("/a", "/b", "/c", "/d")


def padded(name: str) -> bytes:
    """A Hugging Face bundle of a little over 3 MiB (a file no one reads pads it)."""
    files = {"tokenizer.json": tokenizer_json(),
             "tokenizer_config.json": jsoncodec.canonical({"chat_template": FINE}).decode(),
             "notes.txt": name * (3 * MIB)}  # fmt: skip
    return jsoncodec.canonical({"kind": "hf", "files": files})


@dataclass
class SlowBundles:
    """Serves each bundle but its last byte, then the rest once ``gate`` opens (the
    first time; later fetches at once)."""

    bodies: dict[str, bytes]
    gate: Gate = field(default_factory=Gate)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        return await self.gate.send(request, self.bodies[request.path])


@pytest.fixture
async def slow() -> AsyncIterator[tuple[SlowBundles, str]]:
    server = SlowBundles({path: padded(path[1:]) for path in MODELS})
    app = web.Application()
    app.router.add_get("/{name}", server.handle)
    async with served(app) as url:
        yield server, url


async def test_tokenizer_fetches_past_the_budget_refuse_the_largest_and_fetch_it_later(
    slow: tuple[SlowBundles, str], caplog: pytest.LogCaptureFixture
) -> None:
    server, base = slow
    caplog.set_level(logging.WARNING)
    memory = MemoryBudget(8 * MIB)
    limits = TokenizerLimits(bundle_bytes=4 * MIB, cache_bytes=16 * MIB)
    checksums = {path: checksum_of(body) for path, body in server.bodies.items()}
    async with (
        view_of(base, *MODELS, checksums=checksums) as view,
        TokenizerRegistry(view, limits=limits, retry_after=0.05, memory=memory) as registry,
    ):
        cards = [card_of(view, path) for path in MODELS]
        fetches = [asyncio.create_task(registry.for_card(card)) for card in cards]
        await eventually(
            lambda: asyncio.sleep(0.05, memory.refusals),
            lambda n: n >= 1,
            within=60,
            what="a fetch refused for the memory budget",
        )
        assert memory.held <= memory.limit
        server.gate.opened.set()
        got = await asyncio.gather(*fetches)
        refused = [card for card, found in zip(cards, got, strict=True)
                   if isinstance(found, SimpleTokenizer)]  # fmt: skip
        assert refused and all(isinstance(t, (BundledTokenizer, SimpleTokenizer)) for t in got)
        assert len(refused) < len(cards)
        assert memory.held == 0
        for card in refused:  # tried again after the back-off, alone within the budget
            found = await eventually(
                partial(registry.for_card, card),
                lambda t: isinstance(t, BundledTokenizer),
                within=30,
                what=f"the tokenizer of {card.name} fetched again",
            )
            assert isinstance(found, BundledTokenizer)
    warned = [r.getMessage() for r in caplog.records if "cannot be had" in r.getMessage()]
    assert len(warned) == len(refused)  # once each: the fetch after the back-off succeeded
    assert all("over its memory budget of 8388608 (memory_budget_mb = 8)" in w for w in warned)
