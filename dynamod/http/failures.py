"""Why a peer could not be reached, in words: aiohttp's own text for a failed connection
("Cannot connect to host 10.0.0.5:9090 ssl:default [Connect call failed ('10.0.0.5',
9090)]") names its TLS context and says the address twice, once as a Python tuple. Every
message that reports such a failure (a worker's taint route, the front's upstream) says
the cause instead: ``could not connect (Connection refused)``."""

from __future__ import annotations

import os

import aiohttp


def described(exc: BaseException) -> str:
    """What went wrong, to follow "did not answer: " or "is unreachable: "; the message
    names the address already."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"could not connect ({_cause(exc.os_error)})"
    return str(exc) or type(exc).__name__


def _cause(error: OSError) -> str:
    """The OS's words for ``error`` (asyncio's own strerror repeats the address)."""
    if error.errno is not None and error.errno > 0:
        return os.strerror(error.errno)
    return error.strerror or str(error) or type(error).__name__
