"""The etcd backend: the contract of ``base`` on etcd v3, through aetcd's generated stubs.

This package is the only code that talks to etcd. It uses aetcd for etcd's protobuf
messages and stubs, makes its own gRPC channels (aetcd's client has no TLS, logs in once and
talks to one member), and builds the requests itself: aetcd's helpers cannot express
``ignore_lease``, keep-alive once, or a watch stream whose life this store owns.

URL
    ``etcd://host[:port][,host[:port]...][/prefix][?parameters]`` (port 2379). The hosts are
    members of one cluster, tried in that order. The optional prefix is a key namespace:
    store key ``a/b`` lives at etcd key ``<prefix>/a/b``, and keys outside it (or not in the
    key grammar) are never shown. Parameters name files, never secrets (``store._urls``):
    ``ca``, ``cert``, ``key``, ``tls`` for TLS; ``user`` and ``password_file`` for etcd's
    authentication. ``EtcdStore.check_url`` reads them all without connecting.
Members and failover
    One member is in use at a time: the first, in URL order, whose channel is made, whose
    login (with a user) succeeds, and which answers a linearizable read (so its cluster has
    a leader). When a call finds it broken (``faults``: the connection dropped or was
    refused, no answer within half the call's deadline, no leader, the member stopping),
    its channel is closed, which ends every call and watch stream still on it, and the next
    call connects to the next member round the list. A call that is safe to repeat (every
    read, an unconditional put or delete, ``lease=KEEP``, grant, refresh, revoke) is sent
    to the new member within its deadline; a compare-and-swap that was in flight is not
    (had it been applied, the repeat would report a mismatch for a change that was made):
    it fails with ``StoreUnavailableError``, whose outcome is unknown, unless it never left
    this process. A member that comes back is used again only when its turn comes round.
Faults
    ``faults`` sorts gRPC errors: *broken* (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED,
    INTERNAL — gRPC's "Internal error from Core" when a connection drops mid-stream — and
    UNKNOWN for a removed stream) moves to another member; an expired auth token logs in
    again and resends; *busy* ("too many requests", ABORTED) is ``StoreUnavailableError``
    for the caller to retry; everything else (a request over the size limit, permission
    denied, a bad password) is a permanent ``StoreError``.
Revisions
    etcd's own: an entry's revision is the key's ``mod_revision``, a ``Delete`` carries the
    revision of the deletion, ``list`` answers with the response header's revision.
Compare-and-swap
    One transaction per conditional write, comparing ``mod_revision`` (``version == 0`` for
    create-only); its failure branch reads the key in the same transaction, so the actual
    revision in ``RevisionMismatchError`` is exact. ``lease=KEEP`` is ``ignore_lease``.
Leases
    Native etcd leases, which the cluster keeps across a change of member or leader. etcd
    rounds a TTL up to whole seconds and to its minimum (2 s with default election
    settings); ``Lease.ttl`` is the TTL etcd granted. One refresh waits at most a quarter of
    the TTL on a member, so a member that stops answering leaves time to refresh on another.
Watches
    One gRPC watch stream per ``watch()``, fed by a task this store owns (``watches``), with
    etcd's progress notifications on and ``hasleader`` set, so that a member cut off from
    its cluster ends the stream. A stream that ends is opened again, on whichever member
    now serves, from the revision after the last one delivered: no gap and no ``Resync``.
    Only when that history is gone (compacted, or a cluster with another id or whose
    revision went back, as after a restore from backup) is it opened from now and the watch
    told it lost events, so its ``Resync`` (a ``list``) happens after the new stream exists.
    A dead member on a quiet stream is found by gRPC keep-alive pings (10 s + 5 s) or by the
    next call of the same store that finds it broken.
Deadlines
    Every call carries the store's timeout; nothing waits longer.

Modules: ``url`` (the URL), ``faults`` (gRPC errors → what to do), ``members`` (the member
in use and failover), ``watches`` (the watch streams), ``store`` (``EtcdStore``).
"""

from dynamod.store.etcd.store import EtcdStore
from dynamod.store.etcd.url import EtcdUrl, parse_url

__all__ = ["EtcdStore", "EtcdUrl", "parse_url"]
