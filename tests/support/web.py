"""Small HTTP servers for tests and the fake processes they start: ``served(app)`` runs an
aiohttp app on a free loopback port for the length of a block and yields its base URL;
``until_signalled()`` is the life of a fake process (until SIGTERM or SIGINT); a ``Gate``
holds answers back one byte short of their end."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

SHUTDOWN = 5.0
"""Seconds a handler still running when the block ends gets before it is cancelled
(aiohttp's 60 s default made a hanging fake upstream cost each test a minute)."""


@contextlib.asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[str]:
    """``app`` on ``127.0.0.1`` at a free port; its base URL (no trailing slash)."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=SHUTDOWN)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def until_signalled() -> None:
    """Wait for SIGTERM or SIGINT."""
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    await done.wait()


@dataclass
class Gate:
    """Answers held one byte short of their end: ``send`` writes all of a body but its last
    byte (``Content-Length`` the whole), counts itself ``waiting``, and writes the rest
    once ``opened`` is set."""

    opened: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: int = 0

    async def send(self, request: web.Request, body: bytes) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(body)
        await response.prepare(request)
        await response.write(body[:-1])
        self.waiting += 1
        await self.opened.wait()
        await response.write(body[-1:])
        return response
