"""Opening the API client from the global options. Imported only when a command runs: the
gRPC client behind it costs ~100 ms to import, which ``--help`` and completion of commands
and options never pay."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dynamoctl.invocation import Options
from dynamod.client.endpoint import connection

if TYPE_CHECKING:
    from dynamod.client import AsyncClient
    from dynamod.client.endpoint import Connection
    from dynamod.client.light import LightClient


def connect(options: Options, *, timeout: float | None = None) -> AsyncClient:
    """A client for ``options``' endpoint; use it as ``async with connect(options) as c``.
    Unreadable credential files raise ``ConfigError`` naming the flag and the file (the
    files are read by ``dynamod.client.endpoint``, as for any Python program)."""
    from dynamod.client import AsyncClient

    dial = _dial(options, timeout)
    return AsyncClient(dial.endpoint, credentials=dial.credentials, timeout=dial.timeout)


def connect_light(options: Options) -> LightClient:
    """``connect``'s light client (``dynamod.client.light``), without gRPC: for the
    commands ``direct.py`` runs, which it serves alike."""
    from dynamod.client.light import LightClient

    dial = _dial(options, None)
    return LightClient(dial.endpoint, credentials=dial.credentials, timeout=dial.timeout)


def _dial(options: Options, timeout: float | None) -> Connection:
    return connection(
        endpoint=options.target(),
        token_file=options.token_file,
        tls=options.tls,
        cacert=options.cacert,
        cert=options.cert,
        cert_key=options.cert_key,
        timeout=options.timeout if timeout is None else timeout,
    )
