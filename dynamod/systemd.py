"""sd_notify in a few lines of stdlib; a no-op outside systemd.

``notify("READY=1", "STATUS=serving")`` sends one datagram to ``$NOTIFY_SOCKET`` (a path or
an abstract ``@name``). ``watchdog_interval()`` is half of ``$WATCHDOG_USEC`` when the unit
sets ``WatchdogSec=`` (and ``$WATCHDOG_PID`` is unset or ours), else None.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

log = logging.getLogger(__name__)


def notify(*states: str) -> bool:
    """Send ``states`` (``KEY=value`` lines) to systemd; False when not under systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall("\n".join(states).encode())
    except OSError as exc:
        log.warning("sd_notify to %s failed: %s", address, exc)
        return False
    return True


def watchdog_interval() -> float | None:
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2 / 1_000_000
    except ValueError:
        log.warning("ignoring WATCHDOG_USEC=%r: not a number", usec)
        return None


async def watchdog(interval: float) -> None:
    """Ping the watchdog every ``interval`` seconds until cancelled."""
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(interval)
