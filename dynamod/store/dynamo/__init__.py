"""An NVIDIA Dynamo fleet's discovery, read-only: Dynamo's workers as our worker records.

``dynamod --store dynamo+etcd://host:2379`` (or ``dynamo+file:///dir``) watches what a
Dynamo 1.6.1 fleet registers, and presents each model worker as a worker record under
our workers prefix, so the worker view, the router, listings, selectors, events and
``route explain`` work on them unchanged. Nothing is ever written to Dynamo's store:
every write is refused with ``UnsupportedError``. A worker's taints change through its
own route (``dynamod.boundary.taint_writes``), which rewrites its card; the change comes
back through the watch like any other.

How a worker is read (``cards``), which keys are its (``keys``), when it counts as alive
and how its changes become ours (``roster``), where its system port is (``addresses``):
see each module. A record this reader does not understand (a field missing or of another
type, another ``type``, an id that is not its key's) leaves that worker out, with one
error in the log naming the key and the field, and the ``on_refused`` callback (the
daemon's ``dynamod_dynamo_records_refused_total``); it never stops the feed. A worker
holding taints dynamod would not set (the cordon by hand, one its grammar refuses) is read
as it is, with a warning (``on_warned``). A LoRA adapter's card is a name kept beside its
worker (``roster``), shown by ``DynamoStore.with_adapters``.

Sources (``store.Source``): etcd through our own etcd store (``etcd_source``), Dynamo's
file store through inotify and a scan (``file_source``: liveness by Dynamo's own mtime
rule). Dynamo's third discovery backend, Kubernetes (``DynamoWorkerMetadata`` custom
resources, one per pod, read with the API server's list and watch), would be a third
``Source`` feeding the same ``Roster``; it is not written yet, for want of an API server
to test it against.
"""

from dynamod.store.dynamo.addresses import SystemAddresses
from dynamod.store.dynamo.store import DynamoStore
from dynamod.store.dynamo.url import SCHEMES, is_dynamo

__all__ = ["SCHEMES", "DynamoStore", "SystemAddresses", "is_dynamo"]
