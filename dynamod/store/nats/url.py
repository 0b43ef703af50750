"""``nats://`` store URLs: the servers, the bucket, and how to log in (see "URL" in the
package docstring). The URL names files, never secrets (``store._urls``)."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dynamod.errors import ConfigError
from dynamod.store._urls import (
    LOGIN_PARAMS,
    TLS_PARAMS,
    Login,
    Query,
    TlsFiles,
    read_file,
    read_secret,
    servers,
    split,
)

DEFAULT_PORT: Final = 4222
DEFAULT_BUCKET: Final = "dynamo"
FORM: Final = "nats://host[:port][,host[:port]...][/bucket][?parameters]"
PARAMS: Final = (*TLS_PARAMS, *LOGIN_PARAMS, "token_file", "creds", "nkey", "replicas")
MAX_REPLICAS: Final = 5  # JetStream's limit

_BUCKET = re.compile(r"[A-Za-z0-9_-]+")
_LOGINS: Final = ("user", "token_file", "creds", "nkey")


@dataclass(frozen=True)
class NatsUrl:
    """Where a ``nats://`` URL points and how to log in. Holds file paths, never a secret:
    ``connect_options`` reads the files when the store connects."""

    hosts: tuple[str, ...]
    bucket: str
    replicas: int | None = None  # for a bucket this store creates; None: JetStream's 1
    tls: TlsFiles | None = None
    login: Login | None = None
    token_file: Path | None = None
    creds: Path | None = None
    nkey: Path | None = None
    url: str = ""  # the URL as given, to show

    @property
    def servers(self) -> list[str]:
        scheme = "tls" if self.tls is not None else "nats"
        return [f"{scheme}://{host}" for host in self.hosts]

    @property
    def shown(self) -> str:
        """The store URL to show in messages."""
        return self.url or f"nats://{','.join(self.hosts)}/{self.bucket}"

    def connect_options(self) -> dict[str, Any]:
        """nats-py's ``connect`` arguments for TLS and the login, secrets read from files."""
        options: dict[str, Any] = {}
        if self.tls is not None:
            options["tls"] = self.tls.context()
        if self.login is not None:
            options["user"], options["password"] = self.login.user, self.login.password()
        if self.token_file is not None:
            options["token"] = read_secret(self.shown, "token_file", self.token_file)
        if self.creds is not None:
            options["user_credentials"] = self._signing_file("creds", self.creds)
        if self.nkey is not None:
            options["nkeys_seed"] = self._signing_file("nkey", self.nkey)
        return options

    def check(self) -> None:
        """Read every file the URL names: ``ConfigError`` for the first that is unusable."""
        self.connect_options()

    def _signing_file(self, name: str, path: Path) -> str:
        """The path of a creds or NKey seed file, which nats-py reads and signs with."""
        if importlib.util.find_spec("nkeys") is None:
            raise ConfigError(
                f"store URL {self.shown!r}: {name}= needs the nkeys package, which nats-py "
                "signs with (pip install nkeys)"
            )
        text = read_file(self.shown, name, path).decode(errors="replace")
        if name == "creds" and _CREDS not in text:
            raise ConfigError(
                f"store URL {self.shown!r}: creds file {str(path)!r} is not a NATS "
                "credentials file (no user JWT in it)"
            )
        if name == "nkey" and not text.strip().startswith(_SEED):
            raise ConfigError(
                f"store URL {self.shown!r}: nkey file {str(path)!r} holds no user NKey seed "
                "(one line starting with SU)"
            )
        return str(path)


_CREDS: Final = "-----BEGIN NATS USER JWT-----"
_SEED: Final = "SU"  # the encoding of a user NKey seed starts so


def parse_url(url: str) -> NatsUrl:
    """Split a store URL into servers, bucket and login; ``ConfigError`` names what is
    wrong. Reads no file."""
    parts, shown = split(url, "nats", FORM)
    query = Query(shown, parts.query, PARAMS)
    hosts = tuple(f"{host}:{port}" for host, port in servers(shown, parts.netloc, DEFAULT_PORT))
    bucket = parts.path.strip("/") or DEFAULT_BUCKET
    if not _BUCKET.fullmatch(bucket):
        raise ConfigError(
            f"store URL {shown!r} names bucket {bucket!r}; a bucket name is letters, digits, "
            "'-' and '_'"
        )
    logins = [name for name in _LOGINS if query.text(name) is not None]
    if len(logins) > 1:
        raise ConfigError(
            f"store URL {shown!r} names {' and '.join(logins)}; a NATS client logs in one way"
        )
    return NatsUrl(
        hosts,
        bucket,
        query.integer("replicas", 1, MAX_REPLICAS),
        query.tls(),
        query.login(),
        query.path("token_file"),
        query.path("creds"),
        query.path("nkey"),
        shown,
    )
