"""Dynamo's discovery keys, and the keys its workers are shown under here.

Dynamo 1.6.1 keeps a model worker as (among others) two keys on the worker's lease, the
same in etcd and in its file store:

* ``v1/mdc/{namespace}/{component}/{endpoint}/{instance}``: the model card; a LoRA adapter
  the worker serves adds a card one segment further down,
  ``.../{instance}/{lora name}``;
* ``v1/instances/{namespace}/{component}/{endpoint}/{instance}``: the endpoint record
  (the request plane's transport), registered a few milliseconds after the card and
  removed before it on a graceful stop.

``instance`` is the instance id in lowercase hex, **not** zero-padded (``format(id,
"x")``): on etcd the worker's lease id, on the file store a random u64 (which may exceed
2^63). It is only ever parsed with ``int(hex, 16)``, never through a float. A worker is
shown under our workers prefix at ``v1/workers/{namespace}/{component}/{endpoint}/
{instance}``: its id is the key's hex segment as Dynamo wrote it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

from dynamod.records import WORKERS_PREFIX, worker_key

ROOT: Final = "v1"
CARDS: Final = "v1/mdc"
INSTANCES: Final = "v1/instances"
_HEX = re.compile(r"[0-9a-fA-F]{1,16}")

Kind = Literal["card", "lora", "instance"]


@dataclass(frozen=True, order=True)
class WorkerRef:
    """One Dynamo worker (one instance of one endpoint)."""

    namespace: str
    component: str
    endpoint: str
    instance: str
    """The hex segment of its keys, as Dynamo wrote it."""

    @property
    def number(self) -> int:
        """The instance id as Dynamo's values and its frontend carry it (a u64)."""
        return int(self.instance, 16)

    @property
    def card_key(self) -> str:
        return f"{CARDS}/{self._path}"

    @property
    def instance_key(self) -> str:
        return f"{INSTANCES}/{self._path}"

    @property
    def view_key(self) -> str:
        """The key the worker view holds it under: our workers prefix. Only the view sees
        it; what an operator is shown is Dynamo's own ``card_key``."""
        return worker_key(self.namespace, self.component, self.endpoint, self.instance)

    @property
    def _path(self) -> str:
        return f"{self.namespace}/{self.component}/{self.endpoint}/{self.instance}"


@dataclass(frozen=True)
class DynamoKey:
    """A key of Dynamo's that names a model worker's card, a LoRA card or its instance."""

    kind: Kind
    worker: WorkerRef
    lora: str = ""


def parse_key(key: str) -> DynamoKey | None:
    """The worker a Dynamo key belongs to, or None for every other key (event channels,
    the KV-query endpoints, the frontend's own records, anything malformed)."""
    parts = key.split("/")
    if len(parts) < 6 or parts[0] != ROOT or parts[1] not in ("mdc", "instances"):
        return None
    worker = _worker(parts[2:6])
    if worker is None:
        return None
    lora = "/".join(parts[6:])
    if parts[1] == "instances":
        return None if lora else DynamoKey("instance", worker)
    return DynamoKey("lora", worker, lora) if lora else DynamoKey("card", worker)


def parse_shown(key: str) -> WorkerRef | None:
    """The worker shown at ``key`` (under our workers prefix), or None."""
    prefix = WORKERS_PREFIX + "/"
    if not key.startswith(prefix):
        return None
    parts = key[len(prefix) :].split("/")
    return _worker(parts) if len(parts) == 4 else None


def _worker(parts: list[str]) -> WorkerRef | None:
    namespace, component, endpoint, instance = parts
    if not (namespace and component and endpoint) or not _HEX.fullmatch(instance):
        return None
    return WorkerRef(namespace, component, endpoint, instance)
