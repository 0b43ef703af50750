"""What a start needs beyond the settings' values, checked without starting.

``verify`` is what ``dynamod check-config`` and every start run alike: the tokens file
parses, the store URLs and the files they name check out (without connecting), the TLS
files load, the audit log can be written, and every listener can be had
(``verify_listeners``: each TCP address bound and released, all held at once in the
order a start binds them; each unix socket path looked at, ``check_socket_path``). A
listener that cannot be bound is a ``ListenError`` (exit 69); everything else a
``ConfigError`` (exit 78).
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import stat
from pathlib import Path

from dynamod.auth import Tokens
from dynamod.errors import ConfigError, ListenError
from dynamod.http.server import listen as bind_tcp
from dynamod.settings import DaemonSettings, parse_hostport
from dynamod.store import check_url


def verify(settings: DaemonSettings) -> None:
    """Check what ``DaemonSettings`` alone cannot: the files and names a start would use — the
    tokens file parses, the store URL and the files it names check out (without connecting:
    ``store.check_url``), the TLS files load, the audit log can be written — and the
    listeners (``verify_listeners``). ``dynamod check-config`` and every start run this same
    check, so a configuration check-config passes does not fail at start for these reasons
    (but for a port taken in between)."""
    Tokens.load(settings.tokens_file)
    check_url(settings.store)
    if settings.state_store:
        check_url(settings.state_store)
    _verify_tls(settings)
    if settings.audit_log is not None:
        _verify_writable(settings.audit_log, "audit_log")
    verify_listeners(settings)


def verify_listeners(settings: DaemonSettings) -> None:
    """Bind every TCP listener as a start does — the front first, then gRPC's, all held at
    once — and release them; check every unix socket path (``check_socket_path``).
    ``ListenError`` when one is taken or not this host's; nothing is left behind."""
    for address in settings.listen:
        if address.startswith("unix://"):
            check_socket_path(Path(address[len("unix://") :]))
    tcp = [(settings.http, "http")] if settings.http else []
    tcp += [(a, "gRPC") for a in settings.listen if not a.startswith("unix://")]
    with contextlib.ExitStack() as held:
        for address, what in tcp:
            held.enter_context(bind_tcp(*parse_hostport(address, what), what))


def check_socket_path(path: Path) -> bool:
    """Whether a start can make its unix socket at ``path``; True when a stale socket is
    there (no process listens on it: the start replaces it). ``ListenError`` when a
    process listens there; ``ConfigError`` when something else is in the way: a file that
    is not a socket (never replaced), or a directory that cannot be written."""
    where = f"unix://{path}"
    try:
        mode = path.lstat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        _verify_directory(path.parent, where)
        return False
    except OSError as exc:
        raise ConfigError(f"listen address {where!r} cannot be looked at: {exc.strerror}") from None
    if not stat.S_ISSOCK(mode):
        raise ConfigError(
            f"listen address {where!r} names a file that is not a socket; dynamod does not "
            "replace it: choose another path or remove it"
        )
    _verify_directory(path.parent, where)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return True
    raise ListenError(f"cannot listen on {where}: another process is listening there")


def _verify_tls(settings: DaemonSettings) -> None:
    if settings.tls_cert is None or settings.tls_key is None:
        return
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(settings.tls_cert, settings.tls_key)
        if settings.tls_client_ca is not None:
            context.load_verify_locations(settings.tls_client_ca)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"TLS files cannot be used: {exc}") from None


def _verify_writable(path: Path, name: str) -> None:
    """``path`` can be appended to, or created (with its missing parent directories)."""
    existing = path if path.exists() else next(p for p in path.parents if p.exists())
    if existing.is_dir() and existing == path:
        raise ConfigError(f"{name} {str(path)!r} is a directory")
    if not os.access(existing, os.W_OK):
        raise ConfigError(
            f"{name} {str(path)!r} cannot be written (no write access to {str(existing)!r})"
        )


def _verify_directory(directory: Path, where: str) -> None:
    """``directory`` can take a new socket: it is a writable directory, or can be made
    (with its missing parents) in the nearest one that exists."""
    existing = next(p for p in (directory, *directory.parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(f"listen address {where!r}: {str(existing)!r} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"listen address {where!r} cannot be made: no write access to {str(existing)!r}"
        )
