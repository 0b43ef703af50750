"""Which KV event publishers a worker follows when an upstream server names them.

vLLM's ``GET /kv_event_sources`` lists its ZMQ publishers, and the worker connects to each
(``upstream.py``). That answer is the upstream's bytes like any other: a worker follows an
endpoint it names only when

* its scheme is ``tcp``, to the upstream's own host or a loopback address, with a port;
* or its scheme is ``ipc`` (a unix socket path) and the upstream is on this machine (its
  host is a loopback address).

Anything else — another host, ``inproc``, ``pgm``, a ZMQ source address (``tcp://a;b``) —
is refused (``InvalidInputError``; the worker logs it and follows the rest). An endpoint
the operator gives (``--kv-events tcp://...``) is not the upstream's word and is followed
as given.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from dynamod.errors import InvalidInputError


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback: ``localhost``, 127.0.0.0/8, ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def followable(endpoint: str, host: str) -> str:
    """``endpoint``, when a worker whose upstream is at ``host`` may follow it (see the
    module docstring); ``InvalidInputError`` naming the rule it breaks otherwise."""
    parts = urlsplit(endpoint)
    if parts.scheme == "ipc":
        if not is_loopback(host):
            raise InvalidInputError(
                f"KV event endpoint {endpoint!r:.200} is a local socket, and the upstream "
                f"{host!r} is not on this machine"
            )
        return endpoint
    if parts.scheme != "tcp" or ";" in endpoint or parts.path or parts.query:
        raise InvalidInputError(
            f"KV event endpoint {endpoint!r:.200} is not tcp://HOST:PORT or ipc://PATH"
        )
    try:
        port = parts.port
    except ValueError:
        port = None
    target = parts.hostname or ""
    if port is None:
        raise InvalidInputError(f"KV event endpoint {endpoint!r:.200} names no port")
    if target.lower() != host.lower().strip("[]") and not is_loopback(target):
        raise InvalidInputError(
            f"KV event endpoint {endpoint!r:.200} is on host {target!r}, neither the "
            f"upstream's ({host!r}) nor a loopback address"
        )
    return endpoint
