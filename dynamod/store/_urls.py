"""What the etcd and NATS store URLs share: servers, and query parameters that name files.

A store URL is shown in logs, error messages and ``ps`` output, so it never carries a
secret: credentials before ``@`` are refused, and a password, token or key is named by the
path of a file that holds it (``password_file=/etc/dynamod/etcd.pass``). Paths are absolute
(a daemon's working directory is ``/``), percent-encoded like any query value.

Common parameters (each backend adds its own):

``ca=FILE``            PEM bundle of the CAs that sign the servers' certificates; turns TLS on
``cert=FILE``, ``key=FILE``  PEM client certificate and its key (both or neither); TLS on
``tls=true|false``     TLS with the system's CAs when no ``ca`` is given
``user=NAME``          user name; needs ``password_file``
``password_file=FILE`` the user's password: the file's text, one trailing newline dropped

``check()`` on each value reads every file it names, so a URL can be verified without
connecting; the values read the files again when the store opens.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import SplitResult, parse_qsl, urlsplit

from dynamod.errors import ConfigError

_HOST: Final = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")
_TRUE: Final = ("true", "1", "yes", "on")
_FALSE: Final = ("false", "0", "no", "off")
TLS_PARAMS: Final = ("tls", "ca", "cert", "key")
LOGIN_PARAMS: Final = ("user", "password_file")


def split(url: str, scheme: str, form: str) -> tuple[SplitResult, str]:
    """``urlsplit(url)`` and the URL to show; ``ConfigError`` for another scheme, a fragment
    or credentials before ``@`` (which the message does not repeat)."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigError(f"store URL {url!r} does not parse ({exc}); the form is {form}") from None
    _, at, hosts = parts.netloc.rpartition("@")
    shown = url.replace(parts.netloc, hosts, 1) if at else url
    if parts.scheme != scheme or parts.fragment:
        raise ConfigError(f"store URL {shown!r} is malformed; the form is {form}")
    if at:
        raise ConfigError(
            f"store URL {shown!r} carries credentials before '@' (removed from this message); "
            "a URL is shown in logs and ps: name a file with user=NAME&password_file=FILE"
        )
    return parts, shown


def servers(url: str, netloc: str, default_port: int) -> tuple[tuple[str, int], ...]:
    """The ``host[:port],...`` list of a store URL; ``ConfigError`` names a bad server."""
    return tuple(_server(url, item, default_port) for item in netloc.split(","))


def _server(url: str, item: str, default_port: int) -> tuple[str, int]:
    host, port = item, str(default_port)
    if not item.endswith("]") and ":" in item:
        host, _, port = item.rpartition(":")
    if not _HOST.fullmatch(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"store URL {url!r} has server {item!r}; a server is host[:port] with a port "
            "from 1 to 65535, and servers are separated by ','"
        )
    return host, int(port)


class Query:
    """The query parameters of one store URL: known names only, each at most once."""

    def __init__(self, shown: str, query: str, known: Collection[str]) -> None:
        self.url = shown
        self._values: dict[str, str] = {}
        for name, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
            if name not in known:
                raise ConfigError(
                    f"store URL {shown!r} has unknown parameter {name!r}; known: "
                    + ", ".join(known)
                )
            if name in self._values:
                raise ConfigError(f"store URL {shown!r} names parameter {name!r} twice")
            self._values[name] = value

    def text(self, name: str) -> str | None:
        value = self._values.get(name)
        if value == "":
            raise ConfigError(f"store URL {self.url!r} gives parameter {name!r} no value")
        return value

    def path(self, name: str) -> Path | None:
        value = self.text(name)
        if value is None:
            return None
        if not value.startswith("/"):
            raise ConfigError(
                f"store URL {self.url!r}: {name}={value!r} is not an absolute path; "
                "a daemon's working directory is '/', so name files by absolute path"
            )
        return Path(value)

    def flag(self, name: str) -> bool | None:
        value = self.text(name)
        if value is None:
            return None
        if value.lower() not in (*_TRUE, *_FALSE):
            raise ConfigError(f"store URL {self.url!r}: {name}={value!r} is not true or false")
        return value.lower() in _TRUE

    def integer(self, name: str, low: int, high: int) -> int | None:
        value = self.text(name)
        if value is None:
            return None
        if not value.isdigit() or not low <= int(value) <= high:
            raise ConfigError(
                f"store URL {self.url!r}: {name}={value!r} is not a whole number "
                f"from {low} to {high}"
            )
        return int(value)

    def tls(self) -> TlsFiles | None:
        """TLS from ``ca``, ``cert``, ``key`` and ``tls``; None when TLS is off."""
        ca, cert, key = self.path("ca"), self.path("cert"), self.path("key")
        wanted = self.flag("tls")
        if (cert is None) != (key is None):
            raise ConfigError(f"store URL {self.url!r} needs cert and key together, or neither")
        named = ca is not None or cert is not None
        if wanted is False and named:
            raise ConfigError(f"store URL {self.url!r} says tls=false but names TLS files")
        if not named and not wanted:
            return None
        return TlsFiles(self.url, ca, cert, key)

    def login(self) -> Login | None:
        """``user`` and ``password_file``: both, or neither."""
        user, password = self.text("user"), self.path("password_file")
        if (user is None) != (password is None):
            raise ConfigError(
                f"store URL {self.url!r} needs user and password_file together, or neither"
            )
        if user is None or password is None:
            return None
        return Login(self.url, user, password)


def read_secret(url: str, name: str, path: Path) -> str:
    """The secret in the file a URL parameter names: its text with one trailing newline
    dropped; ``ConfigError`` for a file that cannot be read, is empty or has more lines."""
    text = read_file(url, name, path).decode(errors="replace")
    text = text.removesuffix("\n").removesuffix("\r")
    if not text:
        raise ConfigError(f"store URL {url!r}: {name} file {str(path)!r} is empty")
    if "\n" in text:
        raise ConfigError(
            f"store URL {url!r}: {name} file {str(path)!r} has more than one line; "
            "it holds the secret alone"
        )
    return text


def read_file(url: str, name: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"store URL {url!r}: {name} file {str(path)!r} cannot be read: {exc.strerror}"
        ) from None


@dataclass(frozen=True)
class Login:
    """A user name and the file holding its password."""

    url: str
    user: str
    password_file: Path

    def password(self) -> str:
        return read_secret(self.url, "password_file", self.password_file)

    def check(self) -> None:
        self.password()


@dataclass(frozen=True)
class TlsFiles:
    """TLS to the servers: CA bundle (None: the system's) and client certificate."""

    url: str
    ca: Path | None
    cert: Path | None
    key: Path | None

    def pem(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """(CA bundle, client key, client certificate) as PEM bytes, for gRPC."""
        return (
            None if self.ca is None else read_file(self.url, "ca", self.ca),
            None if self.key is None else read_file(self.url, "key", self.key),
            None if self.cert is None else read_file(self.url, "cert", self.cert),
        )

    def context(self) -> ssl.SSLContext:
        """A client context that verifies the servers and presents the client certificate;
        ``ConfigError`` names a file that is missing or not what it should be."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if self.ca is not None:
            read_file(self.url, "ca", self.ca)
            try:
                context.load_verify_locations(cafile=self.ca)
            except (ssl.SSLError, ValueError) as exc:
                raise ConfigError(
                    f"store URL {self.url!r}: ca file {str(self.ca)!r} holds no usable PEM "
                    f"certificate: {exc}"
                ) from None
        if self.cert is not None and self.key is not None:
            read_file(self.url, "cert", self.cert)
            read_file(self.url, "key", self.key)
            try:
                # An empty password: an encrypted key fails here instead of prompting.
                context.load_cert_chain(self.cert, self.key, password="")
            except ssl.SSLError as exc:
                raise ConfigError(
                    f"store URL {self.url!r}: cert {str(self.cert)!r} and key "
                    f"{str(self.key)!r} are not a PEM certificate and its private key: {exc}"
                ) from None
        return context

    def check(self) -> None:
        self.context()
