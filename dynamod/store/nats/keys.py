"""Store keys ↔ NATS subjects (see "Keys" in the package docstring)."""

from __future__ import annotations


def encode_key(key: str) -> str:
    """Store key (or prefix) → NATS key: ``.`` → ``=``, then ``/`` → ``.``."""
    return key.replace(".", "=").replace("/", ".")


def decode_key(token: str) -> str:
    """The inverse of ``encode_key``."""
    return token.replace(".", "/").replace("=", ".")


def subject_filters(root: str, prefix: str) -> list[str]:
    """Subjects under ``root`` (``$KV.<bucket>.``) that match ``prefix`` on segment bounds."""
    if not prefix:
        return [f"{root}>"]
    base = root + encode_key(prefix)
    return [base, f"{base}.>"]
