"""Discovery stores behind one contract (see ``base``), chosen by URL.

``open_store(url)`` imports the backend only when its scheme is used, so the etcd and NATS
clients are never loaded by a process that does not need them.
"""

from __future__ import annotations

import importlib
from urllib.parse import urlsplit

from dynamod.errors import ConfigError
from dynamod.store.base import (
    DEFAULT_TIMEOUT,
    KEEP,
    Delete,
    Entry,
    Guard,
    Lease,
    Put,
    Resync,
    Store,
    Swap,
    Watch,
    WatchEvent,
    keep_alive,
)

BACKENDS = {
    "memory": "dynamod.store.memory:MemoryStore",
    "file": "dynamod.store.file:FileStore",
    "etcd": "dynamod.store.etcd:EtcdStore",
    "nats": "dynamod.store.nats:NatsStore",
    # An NVIDIA Dynamo fleet's discovery, read-only (``store/dynamo``).
    "dynamo+etcd": "dynamod.store.dynamo:DynamoStore",
    "dynamo+file": "dynamod.store.dynamo:DynamoStore",
}

__all__ = [
    "BACKENDS",
    "DEFAULT_TIMEOUT",
    "KEEP",
    "Delete",
    "Entry",
    "Guard",
    "Lease",
    "Put",
    "Resync",
    "Store",
    "Swap",
    "Watch",
    "WatchEvent",
    "check_url",
    "keep_alive",
    "open_store",
    "store_class",
]


def store_class(url: str) -> type[Store]:
    scheme = urlsplit(url).scheme
    target = BACKENDS.get(scheme)
    if target is None:
        valid = ", ".join(f"{s}://" for s in BACKENDS)
        raise ConfigError(f"store URL {url!r} has unknown scheme {scheme!r}; use one of {valid}")
    module, _, name = target.partition(":")
    cls: type[Store] = getattr(importlib.import_module(module), name)
    return cls


def check_url(url: str) -> None:
    """Check a store URL and the files it names without connecting (``ConfigError`` says
    what is wrong): what ``open_store`` would refuse before talking to a server."""
    store_class(url).check_url(url)


async def open_store(url: str, *, timeout: float = DEFAULT_TIMEOUT) -> Store:  # noqa: ASYNC109
    """Open (and connect) the store named by ``url``.

    ``memory://``, ``file:///path/to/dir``, ``etcd://host:2379[,host:2379...][/prefix]``,
    ``nats://host:4222[,host:4222...][/bucket]``; etcd and NATS URLs take parameters that
    name TLS and credential files (README, "Stores in production"). ``dynamo+etcd://...``
    and ``dynamo+file:///dir`` read an NVIDIA Dynamo fleet (README, "Operating an NVIDIA
    Dynamo fleet"). ``timeout``: the deadline of each call (the ``store_timeout`` setting).
    """
    return await store_class(url).open(url, timeout=timeout)
