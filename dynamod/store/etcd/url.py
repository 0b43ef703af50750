"""``etcd://`` store URLs: the members, the key namespace, TLS and the user (see "URL" in the
package docstring)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from dynamod.errors import ConfigError, InvalidKeyError
from dynamod.store._urls import LOGIN_PARAMS, TLS_PARAMS, Login, Query, TlsFiles, servers, split
from dynamod.store.base import validate_key

DEFAULT_PORT: Final = 2379
FORM: Final = "etcd://host[:port][,host[:port]...][/prefix][?parameters]"
PARAMS: Final = (*TLS_PARAMS, *LOGIN_PARAMS)


@dataclass(frozen=True)
class EtcdUrl:
    """A parsed ``etcd://`` URL: members in failover order, the key namespace, and how to
    reach them. Holds file paths, never a secret: the password is read when connecting."""

    endpoints: tuple[tuple[str, int], ...]
    root: str  # "" or "<prefix>/": prepended to every store key
    url: str = ""  # the URL as given, to show
    tls: TlsFiles | None = None
    login: Login | None = None

    def check(self) -> None:
        """Read every file the URL names: ``ConfigError`` for the first that is unusable."""
        if self.tls is not None:
            self.tls.check()
        if self.login is not None:
            self.login.check()


def parse_url(url: str) -> EtcdUrl:
    """Parse an ``etcd://`` URL; ``ConfigError`` names what is wrong. Reads no file."""
    parts, shown = split(url, "etcd", FORM)
    if not parts.netloc:
        raise ConfigError(f"store URL {shown!r} names no server; the form is {FORM}")
    query = Query(shown, parts.query, PARAMS)
    prefix = parts.path.removeprefix("/").removesuffix("/")
    if prefix:
        try:
            validate_key(prefix)
        except InvalidKeyError as exc:
            raise ConfigError(f"store URL {shown!r} has an unusable key prefix: {exc}") from None
    return EtcdUrl(
        servers(shown, parts.netloc, DEFAULT_PORT),
        f"{prefix}/" if prefix else "",
        shown,
        query.tls(),
        query.login(),
    )
