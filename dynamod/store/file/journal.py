"""The file store's change log: append-only generation files of records under ``journal/``.

The journal is the file store's commit point and its revision counter: a change exists once
its record is complete in the journal, and the store revision is the last record's. A
record is one header line and the value::

    P <revision> <lease id> <value size> <key>\\n<value bytes>\\n      (a put)
    D <revision> 0 0 <key>\\n\\n                                       (a delete)

A generation file is named by the revision of its first record (20 digits, so names sort by
revision); a reader that has read record ``R`` knows that a file named ``R + 1`` means its
own generation is complete. When the current generation outgrows its size limit, the next
writer starts a new one and deletes all but the newest two: history for ``watch(since=)``
is what those two hold.

Writers hold the store lock and append; every process tails the current generation from
its own offset. A record is complete when its header, value and final newline are all
there: a shorter tail is a write in progress, or, seen under the lock, one a crash tore,
which ``repair`` cuts off. Only ``OSError`` and ``StoreError`` (for a corrupt file) leave
this module.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from dynamod.errors import StoreError

log = logging.getLogger(__name__)

PUT = "P"
DELETE = "D"
_NAME_DIGITS = 20
_SUFFIX = ".log"


@dataclass(frozen=True)
class Record:
    op: str
    revision: int
    key: str
    lease: int
    value: bytes


def encode(record: Record) -> bytes:
    head = f"{record.op} {record.revision} {record.lease} {len(record.value)} {record.key}\n"
    return head.encode() + record.value + b"\n"


def decode(buf: bytes, where: str) -> tuple[list[Record], int]:
    """The complete records at the start of ``buf`` and how many bytes they take."""
    records: list[Record] = []
    pos = 0
    while (newline := buf.find(b"\n", pos)) >= 0:
        op, revision, lease, size, key = _header(buf[pos:newline], where)
        end = newline + 1 + size
        if end >= len(buf):
            break
        if buf[end] != ord("\n"):
            raise StoreError(f"journal {where}: record {revision} does not end after its value")
        records.append(Record(op, revision, key, lease, buf[newline + 1 : end]))
        pos = end + 1
    return records, pos


def _header(line: bytes, where: str) -> tuple[str, int, int, int, str]:
    try:
        op, revision, lease, size, key = line.decode().split(" ")
        if op not in (PUT, DELETE):
            raise ValueError(f"unknown operation {op!r}")
        return op, int(revision), int(lease), int(size), key
    except ValueError as exc:
        raise StoreError(f"journal {where}: header {line[:80]!r} does not parse ({exc})") from None


class Journal:
    """The journal in ``directory``, tailed from this process."""

    def __init__(self, directory: Path, *, generation_bytes: int) -> None:
        self.directory = directory
        self.generation_bytes = generation_bytes
        self.last_revision = 0
        self.last_record: Record | None = None
        self._fd = -1
        self._first = 1
        self._offset = 0

    def open(self) -> None:
        """Open the newest generation (creating the first one) and read it to its end."""
        generations = self.generations()
        self._open(generations[-1] if generations else 1, create=not generations)
        self.read_new()

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def generations(self) -> list[int]:
        """First revisions of the generation files on disk, oldest first."""
        names = (n for n in os.listdir(self.directory) if n.endswith(_SUFFIX))
        return sorted(int(n[: -len(_SUFFIX)]) for n in names if n[: -len(_SUFFIX)].isdigit())

    def read_new(self) -> tuple[list[Record], bool]:
        """Records completed since the last call, in order, and whether history was lost:
        ``True`` when this reader fell two generations behind and jumped to the newest one
        (the records returned then start there, after a gap)."""
        records: list[Record] = []
        lost = False
        while True:
            records += self._read_current()
            following = self.last_revision + 1
            exists = following != self._first and self._path(following).exists()
            if exists and self._try_open(following):
                continue
            if os.fstat(self._fd).st_nlink > 0:
                return records, lost
            # Our generation was deleted and so was its successor: skip to the newest.
            self._open(self._newest(), create=False)
            records, lost = [], True

    def repair(self) -> None:
        """Cut off a torn tail. Only under the lock, right after ``read_new``: no writer is
        active, so bytes past the last complete record are a crashed writer's."""
        size = os.fstat(self._fd).st_size
        if size > self._offset:
            log.warning(
                "journal %s: cutting %d bytes of a write torn by a crash",
                self._path(self._first),
                size - self._offset,
            )
            os.ftruncate(self._fd, self._offset)

    def append(self, op: str, key: str, lease: int, value: bytes) -> Record:
        """Append the next revision's record (under the lock, after ``read_new`` and
        ``repair``), starting a new generation first when this one is full."""
        if self._offset >= self.generation_bytes:
            self._rotate()
        record = Record(op, self.last_revision + 1, key, lease, value)
        data = encode(record)
        written = 0
        while written < len(data):
            written += os.write(self._fd, data[written:])
        self._advance(len(data), [record])
        return record

    def since(self, since: int) -> list[Record] | None:
        """The records after ``since`` up to ``last_revision``; ``None`` when the journal no
        longer holds all of them."""
        if since >= self.last_revision:
            return []
        generations = self.generations()
        start = [first for first in generations if first <= since + 1]
        if not start:
            return None
        records: list[Record] = []
        for first in generations[generations.index(start[-1]) :]:
            try:
                data = self._path(first).read_bytes()
            except FileNotFoundError:
                return None
            batch, _ = decode(data, str(self._path(first)))
            records += [r for r in batch if since < r.revision <= self.last_revision]
        complete = bool(records) and records[0].revision == since + 1
        return records if complete and records[-1].revision == self.last_revision else None

    def _read_current(self) -> list[Record]:
        size = os.fstat(self._fd).st_size
        if size <= self._offset:
            return []
        buf = os.pread(self._fd, size - self._offset, self._offset)
        where = f"{self._path(self._first)} at byte {self._offset}"
        records, used = decode(buf, where)
        self._advance(used, records)
        return records

    def _advance(self, size: int, records: list[Record]) -> None:
        for record in records:
            if record.revision != self.last_revision + 1:
                raise StoreError(
                    f"journal {self._path(self._first)}: revision {record.revision} follows "
                    f"{self.last_revision}; revisions must be consecutive"
                )
            self.last_revision = record.revision
            self.last_record = record
        self._offset += size

    def _newest(self) -> int:
        generations = self.generations()
        if not generations:
            raise StoreError(
                f"journal directory {self.directory} has no generation files left; "
                "were they removed by hand? Stop every process of this store and start afresh"
            )
        return generations[-1]

    def _rotate(self) -> None:
        self._open(self.last_revision + 1, create=True)
        for first in self.generations()[:-2]:
            self._path(first).unlink(missing_ok=True)

    def _try_open(self, first: int) -> bool:
        try:
            self._open(first, create=False)
        except FileNotFoundError:
            return False
        return True

    def _open(self, first: int, *, create: bool) -> None:
        # Readers never create: a stray empty generation would fake history for since=.
        flags = os.O_RDWR | os.O_APPEND | (os.O_CREAT if create else 0)
        fd = os.open(self._path(first), flags, 0o666)
        self.close()
        self._fd, self._first, self._offset = fd, first, 0
        self.last_revision = first - 1
        # A record of an older generation is never the one a crash left unapplied: the
        # writer that started this generation had recovered it already.
        self.last_record = None

    def _path(self, first: int) -> Path:
        return self.directory / f"{first:0{_NAME_DIGITS}d}{_SUFFIX}"
