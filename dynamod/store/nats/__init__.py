"""The NATS JetStream KV backend: the contract of ``base`` on one KV bucket, through nats-py.

This package is the only code that talks to NATS. It uses nats-py for the connection and the
JetStream API, and publishes and consumes the bucket's stream itself: the KV helpers drop a
key's TTL on update (``put``/``update`` have no TTL), treat an expiry marker as a value, and
their watcher stalls for ~14 s after a server restart.

URL
    ``nats://[user:password@]host[:port][,host[:port]...][/bucket]`` (port 4222, bucket
    ``dynamo`` by default). The bucket is created with history 1, per-message TTL and expiry
    markers; an existing bucket gains the last two in place, one with history > 1 is refused
    (an expiring key would reveal its older value). Needs nats-server 2.11 or newer.
Keys
    ``/`` becomes the subject separator ``.``, and ``.`` inside a segment becomes ``=``
    (legal in NATS keys, illegal in ours, so the mapping is reversible). A prefix ``a/b``
    is the filter pair ``a.b`` + ``a.b.>``, which never matches ``a.bc``.
Revisions
    The stream sequence. Writes that compare publish with
    ``Nats-Expected-Last-Subject-Sequence`` after a read of the key's last message: a
    delete tombstone or an expiry marker is *absent* for us (create works over it, ``expect=N``
    on it is ``KeyNotFoundError``), which the server's check alone cannot tell. So a create
    of a fresh key costs one round trip and any other compare-and-swap two.
Leases
    NATS has none: a ``Lease`` lives in the store that granted it. A key written with it is
    published with ``Nats-TTL`` (the lease's remaining time, whole seconds, at least 1) and
    a ``Dynamo-Lease`` header naming it; ``refresh`` re-publishes each of its keys with its
    current value by compare-and-swap and the full TTL, re-reading on a conflict so that a
    rewrite by another process is kept, never clobbered. ``lease=KEEP`` copies both headers
    from the current message, so such a rewrite restarts that key's TTL but keeps it bound.
    A key of the lease that is gone ends the lease (``LeaseExpiredError``); a key rewritten
    without the lease's header was unbound by its writer and is no longer refreshed.
    Expiry reaches watchers as the server's marker; markers live ``MARKER_TTL`` seconds,
    our own delete tombstones until the key is written again.
Watches
    One push consumer per ``watch()`` (memory storage, no acks, idle heartbeats), fed into
    the watch by a task this store owns. With ``since`` the consumer starts at ``since + 1``;
    history is one message per key, so this replay is *compacted*: it holds the latest
    change of each key after ``since``, in store order, ending at the true state. It is used
    only while no expiry marker after ``since`` can have aged out (judged by message times
    against ``MARKER_TTL / 2``, leaving room for clock skew); otherwise the watch starts
    with a ``Resync``. A disconnect, a reconnect, a missed heartbeat or a gap in the
    consumer sequence closes the consumer; a new one is made once connected, and only then
    is the watch told it lost events, so its ``Resync`` happens after the new consumer exists.
Deadlines
    Every call runs under the store's timeout. A call made while the connection is down
    fails at once, and a call in flight when it drops fails as soon as the client notices:
    both are ``StoreUnavailableError``, whose outcome for a write is unknown.

Modules, one job each ("stream" always means the bucket's JetStream stream)::

    url        the store URL: servers, credentials, bucket
    keys       store keys <-> subjects
    messages   what a key's last message means: value, tombstone, marker; the expect rules
    bucket     the bucket's stream: made ready, read, appended to by compare-and-swap
    leases     the leases this store granted and the refresh of their keys
    consumers  the ordered push consumers behind list() and every watch
    store      NatsStore: the calls, the connection and its deadlines, the watch tasks
"""

from dynamod.store.nats.bucket import MARKER_TTL
from dynamod.store.nats.consumers import HEARTBEAT
from dynamod.store.nats.keys import decode_key, encode_key, subject_filters
from dynamod.store.nats.store import NatsStore
from dynamod.store.nats.url import NatsUrl, parse_url

__all__ = [
    "HEARTBEAT",
    "MARKER_TTL",
    "NatsStore",
    "NatsUrl",
    "decode_key",
    "encode_key",
    "parse_url",
    "subject_filters",
]
