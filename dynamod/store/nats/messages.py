"""What a message on the bucket's stream means to the store: a value, a tombstone or an
expiry marker; the headers this store reads and writes; the contract's ``expect`` rules
against a key's last message."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from dynamod.errors import KeyNotFoundError, RevisionMismatchError

OPERATION: Final = "KV-Operation"
MARKER: Final = "Nats-Marker-Reason"
TTL: Final = "Nats-TTL"
LEASE: Final = "Dynamo-Lease"
EXPECT: Final = "Nats-Expected-Last-Subject-Sequence"
DELETE: Final = {OPERATION: "DEL"}


@dataclass(frozen=True)
class LastMessage:
    """The last message of one key's subject: a value, a tombstone or an expiry marker."""

    seq: int
    value: bytes
    headers: Mapping[str, str]

    @property
    def live(self) -> bool:
        return not is_tombstone(self.headers)


def is_tombstone(headers: Mapping[str, str]) -> bool:
    """Whether a message removes its key: our DEL, a KV PURGE, or a server marker."""
    return MARKER in headers or headers.get(OPERATION) in ("DEL", "PURGE")


def check_expect(key: str, expect: int | None, current: LastMessage | None) -> None:
    """The contract's ``expect`` rules against the key's current message."""
    if expect is None:
        return
    actual = current.seq if current is not None and current.live else 0
    if expect and not actual:
        raise KeyNotFoundError(key)
    if actual != expect:
        raise RevisionMismatchError(key, expect, actual)


def kept_headers(current: LastMessage | None) -> dict[str, str]:
    """``lease=KEEP``: the TTL and lease headers of the current value, if it has them."""
    if current is None or not current.live:
        return {}
    return {name: current.headers[name] for name in (TTL, LEASE) if name in current.headers}
