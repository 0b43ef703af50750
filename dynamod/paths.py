"""Where dynamod keeps things by default, following systemd's directories.

The socket lives in ``$RUNTIME_DIRECTORY`` (set by ``RuntimeDirectory=``), else
``/run/dynamod`` when writable, else ``$XDG_RUNTIME_DIR/dynamod``, else
``/tmp/dynamod-<uid>``. State (the file store, the audit log) lives in
``$STATE_DIRECTORY`` (``StateDirectory=``), else ``/var/lib/dynamod`` when writable, else
``$XDG_STATE_HOME/dynamod`` or ``~/.local/state/dynamod``.
"""

from __future__ import annotations

import os
from pathlib import Path


def _first(variable: str) -> Path | None:
    value = os.environ.get(variable)
    return Path(value.split(":")[0]) if value else None


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK | os.X_OK)


def _systemd_or(variable: str, system: Path) -> Path | None:
    """The directory systemd hands over in ``variable``, else ``system`` when writable."""
    return _first(variable) or (system if _writable(system) else None)


def runtime_dir() -> Path:
    found = _systemd_or("RUNTIME_DIRECTORY", Path("/run/dynamod"))
    if found:
        return found
    xdg = _first("XDG_RUNTIME_DIR")
    return xdg / "dynamod" if xdg else Path(f"/tmp/dynamod-{os.getuid()}")


def state_dir() -> Path:
    found = _systemd_or("STATE_DIRECTORY", Path("/var/lib/dynamod"))
    if found:
        return found
    xdg = _first("XDG_STATE_HOME")
    return (xdg or Path.home() / ".local" / "state") / "dynamod"


def default_socket() -> Path:
    return runtime_dir() / "dynamod.sock"


def default_store() -> str:
    return (state_dir() / "store").as_uri()
