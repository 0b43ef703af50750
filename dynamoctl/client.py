"""Opening the API client from the global options. Imported only when a command runs: the
gRPC client behind it costs ~100 ms to import, which ``--help`` and completion of commands
and options never pay."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dynamoctl.options import Options
from dynamod.errors import ConfigError

if TYPE_CHECKING:
    from dynamod.client import AsyncClient


def _read(path: Path, flag: str) -> bytes:
    try:
        return path.expanduser().read_bytes()
    except OSError as exc:
        raise ConfigError(f"{flag} {str(path)!r} cannot be read: {exc.strerror}") from None


def connect(options: Options, *, timeout: float | None = None) -> AsyncClient:
    """A client for ``options``' endpoint; use it as ``async with connect(options) as c``.
    Unreadable credential files raise ``ConfigError`` naming the flag and the file."""
    from dynamod.auth import read_token_file
    from dynamod.client import AsyncClient, Credentials

    if (options.cert is None) != (options.cert_key is None):
        raise ConfigError("--cert and --cert-key must be given together (mutual TLS)")
    credentials = Credentials(
        token=read_token_file(options.token_file) if options.token_file else None,
        tls=options.tls,
        ca=_read(options.cacert, "--cacert") if options.cacert else None,
        cert=_read(options.cert, "--cert") if options.cert else None,
        key=_read(options.cert_key, "--cert-key") if options.cert_key else None,
    )
    return AsyncClient(
        options.target(),
        credentials=credentials,
        timeout=options.timeout if timeout is None else timeout,
    )
