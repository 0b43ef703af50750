"""The file store's current state: one file per key under ``keys/``.

A key file holds one header line, then the value::

    <revision> <lease id, 0 for none> <key>\\n<value bytes>

The file name is the key with ``/`` percent-encoded (``v1%2Fworkers%2F...``), readable and
reversible because keys never hold ``%``; a key whose encoding is too long for a file name
is stored as ``#`` and its SHA-256 (``#`` never appears in an encoded key), and its header
still names it. Files are replaced whole (a temporary file in ``tmp/``, then ``os.replace``),
so a reader without the lock sees either the old or the new file, never a mix; a crashed
writer leaves at most a temporary file, which nothing reads. Only ``OSError`` and
``StoreError`` (for a file that does not parse) leave this module.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote

from dynamod.errors import StoreError
from dynamod.store.base import Entry, in_prefix
from dynamod.store.file.journal import PUT, Record

MAX_NAME = 200
"""Longest readable file name; below every common file system's 255-byte limit."""


@dataclass(frozen=True)
class KeyFile:
    entry: Entry
    lease: int


def write_atomic(tmp_dir: Path, target: Path, data: bytes) -> None:
    """Replace ``target`` with ``data`` in one step, through a temporary file in ``tmp_dir``
    (same file system). No fsync: this survives a killed process, not a power cut. The mode
    is 0666 less the umask (not mkstemp's 0600), so processes of one group can share a store."""
    temp = tmp_dir / secrets.token_hex(8)
    try:
        with temp.open("xb") as file:
            file.write(data)
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def file_name(key: str) -> str:
    name = quote(key, safe="")
    return name if len(name) <= MAX_NAME else "#" + hashlib.sha256(key.encode()).hexdigest()


class KeyFiles:
    """The key files in ``directory``; temporary files go to ``tmp_dir``."""

    def __init__(self, directory: Path, tmp_dir: Path) -> None:
        self.directory = directory
        self.tmp_dir = tmp_dir

    def read(self, key: str) -> KeyFile | None:
        return self._load(self.directory / file_name(key))

    def write(self, record: Record) -> None:
        """Make ``record`` (a put) the key's current state."""
        head = f"{record.revision} {record.lease} {record.key}\n".encode()
        write_atomic(self.tmp_dir, self.directory / file_name(record.key), head + record.value)

    def remove(self, key: str) -> None:
        (self.directory / file_name(key)).unlink(missing_ok=True)

    def apply(self, record: Record) -> bool:
        """Redo ``record`` unless the key file already reflects it; whether it had to.
        Idempotent: this is how the next lock holder finishes a write whose writer died
        after journaling it."""
        current = self.read(record.key)
        if record.op == PUT:
            if current is not None and current.entry.revision >= record.revision:
                return False
            self.write(record)
            return True
        if current is None or current.entry.revision >= record.revision:
            return False
        self.remove(record.key)
        return True

    def scan(self, prefix: str) -> list[KeyFile]:
        """Every key file under ``prefix``, sorted by key."""
        found: list[KeyFile] = []
        for name in os.listdir(self.directory):
            if not name.startswith("#") and not in_prefix(unquote(name), prefix):
                continue
            loaded = self._load(self.directory / name)
            if loaded is not None and in_prefix(loaded.entry.key, prefix):
                found.append(loaded)
        return sorted(found, key=lambda f: f.entry.key)

    @staticmethod
    def _load(path: Path) -> KeyFile | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        head, _, value = data.partition(b"\n")
        try:
            revision, lease, key = head.decode().split(" ")
            return KeyFile(Entry(key, value, int(revision)), int(lease))
        except ValueError:
            raise StoreError(
                f"key file {path} has header {head[:80]!r}, not '<revision> <lease> <key>'; "
                "it was not written by this store: move it away"
            ) from None
