"""The default replica id: the host name and a suffix kept beside the audit log.

A replica's id names it in the ready line, ``status``, the pool leader's key and every
audit line the pool leader writes (caller ``pools@<replica>``). ``<host>-<pid>`` changed at
every restart, so such a line could not be traced back to a daemon. The suffix is made
once (8 hex digits) and kept in ``<audit log>.replica-id``, beside the log whose lines it
explains (``/var/lib/dynamod/audit.log.replica-id``). So a restarted daemon keeps its id,
and two daemons on one host, which need an audit log each anyway, get two. Removing the
file gives the next start a new suffix; ``replica_id`` (``--replica-id``,
``DYNAMO_REPLICA_ID``) names the replica outright and no file is read or written.

With no audit log there is no line to trace and no place that is this daemon's alone (two
daemons without one on a host would share any other file, and so one id, which the pools'
demand records and status tell daemons apart by), so the id is ``<host>-<pid>``; so too
when the file cannot be made (a read-only directory): a daemon does not refuse to start
for want of a stable name. A file that is
there but cannot be read, or holds something other than a suffix, is a ``ConfigError``
naming it: it needs a person.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from pathlib import Path

from dynamod.errors import ConfigError, shown

BESIDE_AUDIT_LOG = ".replica-id"
"""Appended to the audit log's path: the file that keeps the suffix."""
MAX_SUFFIX = 64
SUFFIX_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


def default_replica_id(audit_log: Path | None) -> str:
    """``<host>-<suffix>``, the suffix read from (or first written to) ``suffix_file``;
    ``<host>-<pid>`` without an audit log."""
    host = socket.gethostname()
    suffix = None if audit_log is None else kept_suffix(suffix_file(audit_log))
    return f"{host}-{suffix if suffix is not None else os.getpid()}"


def suffix_file(audit_log: Path) -> Path:
    return audit_log.with_name(audit_log.name + BESIDE_AUDIT_LOG)


def kept_suffix(path: Path) -> str | None:
    """The suffix in ``path``, made and written there first if there is no file; None when
    it cannot be written."""
    found = _read(path)
    if found is not None:
        return found
    suffix = secrets.token_hex(4)
    # Written whole or not at all: a crash leaves no empty file, and of two starts racing,
    # one file wins (``link`` never replaces one).
    draft = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        draft.write_text(suffix + "\n")
        os.link(draft, path)
    except FileExistsError:
        return _read(path) if path.exists() else None  # theirs holds, or the way is blocked
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):
            draft.unlink()
    return suffix


def _read(path: Path) -> str | None:
    """The suffix kept in ``path``; None when there is no file."""
    try:
        text = path.read_text()
    except (FileNotFoundError, NotADirectoryError):  # none there, or none can be
        return None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "it is not text"
        raise ConfigError(
            f"the replica id's suffix file {str(path)!r} cannot be read: {why}; fix or "
            "remove it, or set replica_id"
        ) from None
    suffix = text.strip()
    if not 0 < len(suffix) <= MAX_SUFFIX or not all(c in SUFFIX_CHARACTERS for c in suffix):
        raise ConfigError(
            f"the replica id's suffix file {str(path)!r} holds {shown(suffix, 80)}, not a "
            f"suffix (1 to {MAX_SUFFIX} letters, digits, '-' or '_'); remove it for a new "
            "one, or set replica_id"
        )
    return suffix
