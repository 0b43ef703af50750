"""Serving an aiohttp application: the one way the worker's two servers and the daemon's
front are bound."""

from __future__ import annotations

import contextlib

from aiohttp import web


async def serve_app(
    stack: contextlib.AsyncExitStack, app: web.Application, host: str, port: int
) -> tuple[str, int]:
    """Bind ``app`` on ``host:port`` (0 picks one); cleaned up when ``stack`` closes.

    Handlers are cancelled when their client disconnects (``handler_cancellation``): a
    stream stops at once instead of at its next write."""
    runner = web.AppRunner(
        app, access_log=None, shutdown_timeout=1.0, handle_signals=False, handler_cancellation=True
    )
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    bound: int = runner.addresses[0][1]
    return host, bound


def url(host: str, port: int) -> str:
    return f"http://{host}:{port}"
