"""Loopback ports for the servers and processes a test starts.

``free_port()`` binds port 0 no more: the kernel hands out the port just closed again, and a
test cluster once got one port for two members. It picks from below the kernel's ephemeral
range (so no outgoing connection takes the port between the pick and the server's bind), in
a slice of its own for each xdist worker, walking the slice from a random start: one process
hands out a port again only after every other port of its slice (some 2,800), so the members
of one cluster never share one. A port another program takes in between still makes the
server fail with "address already in use": ``servers.py`` starts it again on fresh ports
then.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10_000
SLICES = 8  # xdist workers gw0..gw7 get slices of their own; more share them
_cursor: list[int] = []  # the next offset into span(), from a random start


def ephemeral_start() -> int:
    """The lowest port the kernel hands out for port 0 and outgoing connections."""
    try:
        return int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def span() -> range:
    """The ports this process picks from: its xdist worker's slice below the ephemeral
    range."""
    top = max(ephemeral_start(), LOWEST + 2_000 * SLICES)
    width = (top - LOWEST) // SLICES
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) % SLICES if worker.isdigit() else 0
    return range(LOWEST + index * width, LOWEST + (index + 1) * width)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A loopback port nobody holds now, the next one of this process's walk."""
    ports = span()
    if not _cursor:
        _cursor.append(random.randrange(len(ports)))
    for _ in range(len(ports)):
        port = ports[_cursor[0] % len(ports)]
        _cursor[0] += 1
        if _bindable(port):
            return port
    raise RuntimeError(f"no free loopback port left in {ports.start}-{ports.stop - 1}")


def in_use(log: str) -> bool:
    """Whether a server's log says it could not bind a port someone else holds."""
    return "address already in use" in log.lower()
