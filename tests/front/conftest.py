"""The front's readers' tests share one server: ``serve(handler)`` serves ``handler`` at
``/`` until the test ends and returns its URL."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from tests.support.web import served

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Serve = Callable[[Handler], Awaitable[str]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Serves a handler at ``/`` until the test ends; its URL."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(handler: Handler) -> str:
            app = web.Application()
            app.router.add_get("/", handler)
            return await stack.enter_async_context(served(app)) + "/"

        yield start
