"""``DynamoStore``: a Dynamo fleet's discovery as a read-only ``Store`` of worker records."""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import Final, Protocol, Self

from dynamod.errors import UnsupportedError
from dynamod.records import WorkerRecord
from dynamod.store.base import DEFAULT_TIMEOUT, Entry, Lease, LeaseArg, Store, Watch, validate_key
from dynamod.store.dynamo.addresses import SystemAddresses
from dynamod.store.dynamo.cards import RecordKind
from dynamod.store.dynamo.keys import WorkerRef, parse_key, parse_shown
from dynamod.store.dynamo.roster import Refusals
from dynamod.store.dynamo.url import check_url, parse_url

SHOWN_ADAPTERS: Final = 100
"""How many of a worker's LoRA adapters ``with_adapters`` names (the first, by name)."""


class Source(Protocol):
    """Where a fleet's records come from (etcd, Dynamo's file store; Kubernetes'
    ``DynamoWorkerMetadata`` resources would be a third), joined into shown entries."""

    async def list(self, prefix: str) -> tuple[list[Entry], int]:
        """The shown entries under ``prefix`` and the revision they are at, read now."""

    async def get(self, ref: WorkerRef) -> Entry | None:
        """One worker's shown entry, read now (None: not there, or not understood)."""

    async def ping(self) -> None:
        """Return if the fleet's store answers, else raise ``StoreUnavailableError``."""

    def adapters(self, ref: WorkerRef) -> Collection[str]:
        """The LoRA adapters the worker has cards for, as the feed last saw them."""

    def stream(self, watch: Watch) -> contextlib.AbstractAsyncContextManager[None]:
        """Feed ``watch`` (``Store._stream``'s contract, always from a ``Resync``)."""

    async def aclose(self) -> None: ...


class DynamoStore(Store):
    """An NVIDIA Dynamo fleet's workers as worker records under ``v1/workers``; every
    write is refused (see the package docstring)."""

    def __init__(self, url: str, source: Source, refusals: Refusals) -> None:
        super().__init__(url)
        self.source = source
        self.refusals = refusals

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        addresses: SystemAddresses | None = None,
        on_refused: Callable[[RecordKind], None] | None = None,
        on_warned: Callable[[], None] | None = None,
        timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - Store.timeout (reads only)
    ) -> Self:
        """Open the fleet's store. ``addresses``: how to find each worker's system port
        (the card's URLs by default); ``on_refused``: called once per record that is not
        understood, with its kind, and ``on_warned`` once per warning about a worker read
        (the daemon counts both: ``roster.Refusals``)."""
        target = parse_url(url)
        addresses = addresses or SystemAddresses()
        refusals = Refusals(on_refused, on_warned)
        source: Source
        if target.root is not None:
            from dynamod.store.dynamo.file_source import FileSource

            source = await FileSource.open(target.root, addresses, refusals)
        else:
            from dynamod.store.dynamo.etcd_source import EtcdSource

            source = await EtcdSource.open(target.etcd, addresses, refusals)
        store = cls(target.url, source, refusals)
        store.timeout = timeout
        return store

    @classmethod
    def check_url(cls, url: str) -> None:
        check_url(url)

    async def get(self, key: str) -> Entry | None:
        self._check_open()
        ref = parse_shown(validate_key(key))
        if ref is None:
            await self.source.ping()  # nothing else is here; but say if the store is down
            return None
        return await self.source.get(ref)

    async def list(self, prefix: str) -> tuple[list[Entry], int]:
        self._check_open()
        return await self.source.list(validate_key(prefix, prefix=True))

    def view_ref(self, ref: str) -> str:
        """``ref`` (what an operator names a worker by), with a Dynamo card's key, as shown
        (``v1/mdc/...``), turned into the key the worker view holds it at."""
        found = parse_key(ref)
        return found.worker.view_key if found is not None and found.kind == "card" else ref

    def with_adapters(self, record: WorkerRecord) -> WorkerRecord:
        """``record`` with its LoRA adapters in ``extra.dynamo``: ``lora_count`` and the
        first ``SHOWN_ADAPTERS`` names (``loras``). They are no part of the record the view
        and the router hold (``roster``: an adapter's card costs O(1)); this is what
        ``workers get`` shows."""
        ref = parse_shown(record.key)
        names = self.source.adapters(ref) if ref is not None else ()
        shown = heapq.nsmallest(SHOWN_ADAPTERS, names)
        dynamo = {**record.extra.get("dynamo", {}), "loras": shown, "lora_count": len(names)}
        return replace(record, extra={**record.extra, "dynamo": dynamo})

    async def put(
        self, key: str, value: bytes, *, expect: int | None = None, lease: LeaseArg = None
    ) -> int:
        raise self._read_only(f"write {key!r}")

    async def delete(self, key: str, *, expect: int | None = None) -> None:
        raise self._read_only(f"delete {key!r}")

    async def grant(self, ttl: float) -> Lease:
        raise self._read_only("grant a lease")

    async def refresh(self, lease: Lease) -> None:
        raise self._read_only("refresh a lease")

    async def revoke(self, lease: Lease) -> None:
        raise self._read_only("revoke a lease")

    def _stream(
        self, watch: Watch, prefix: str, since: int | None
    ) -> contextlib.AbstractAsyncContextManager[None]:
        return self.source.stream(watch)

    async def _close(self) -> None:
        await self.source.aclose()

    def _read_only(self, what: str) -> UnsupportedError:
        self._check_open()
        return UnsupportedError(
            f"cannot {what}: {self.url} is an NVIDIA Dynamo fleet, which dynamod reads and "
            "never writes (Dynamo's frontend refuses card changes other than taints, and a "
            "worker rewrites its card from the stored one); a worker's taints change "
            "through its own route: dynamoctl taints set/add/rm/clear; dynamod's own state "
            "(pool policies) goes to the store its state_store setting names"
        )
