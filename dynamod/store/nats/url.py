"""``nats://`` store URLs: the servers, the credentials and the bucket (see "URL" in the
package docstring)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from dynamod.errors import ConfigError

DEFAULT_PORT: Final = 4222
DEFAULT_BUCKET: Final = "dynamo"

_BUCKET = re.compile(r"[A-Za-z0-9_-]+")
_HOST = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")


@dataclass(frozen=True)
class NatsUrl:
    """Where a ``nats://`` URL points. ``login`` (``user:password`` or a token) is kept out
    of ``url`` and of the repr, so it never reaches a log line or an error message."""

    hosts: tuple[str, ...]
    bucket: str
    login: str = field(default="", repr=False)

    @property
    def servers(self) -> list[str]:
        """Server URLs for the client, credentials included."""
        login = f"{self.login}@" if self.login else ""
        return [f"nats://{login}{host}" for host in self.hosts]

    @property
    def url(self) -> str:
        """The store URL to show: canonical, without credentials."""
        return f"nats://{','.join(self.hosts)}/{self.bucket}"


def parse_url(url: str) -> NatsUrl:
    """Split a store URL into servers and bucket; ``ConfigError`` names what is wrong."""
    parts = urlsplit(url)
    shown = url.replace(parts.netloc, parts.netloc.rpartition("@")[2])
    if parts.scheme != "nats" or parts.query or parts.fragment:
        raise ConfigError(
            f"store URL {shown!r} is not of the form nats://host[:port][,host[:port]...][/bucket]"
        )
    login, _, hosts = parts.netloc.rpartition("@")
    servers = tuple(_host_port(shown, item) for item in hosts.split(","))
    bucket = parts.path.strip("/") or DEFAULT_BUCKET
    if not _BUCKET.fullmatch(bucket):
        raise ConfigError(
            f"store URL {shown!r} names bucket {bucket!r}; a bucket name is letters, digits, "
            "'-' and '_'"
        )
    return NatsUrl(servers, bucket, login)


def _host_port(url: str, item: str) -> str:
    host, colon, port = item.rpartition(":")
    if not colon or host.endswith(":"):  # no port, or a bare IPv6 address
        host, port = item, str(DEFAULT_PORT)
    if not _HOST.fullmatch(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"store URL {url!r} has server {item!r}; a server is host[:port] with a port "
            "from 1 to 65535"
        )
    return f"{host}:{port}"
