"""``dynamo+etcd://`` and ``dynamo+file://`` URLs: a Dynamo fleet's discovery, read-only.

``dynamo+etcd://host[:port][,host[:port]...][?parameters]`` is exactly our ``etcd://``
URL (members, ``ca``/``cert``/``key``/``tls``, ``user``/``password_file``) behind
``dynamo+``, without a key prefix: Dynamo keeps its keys at the root of etcd (``v1/``).
``dynamo+file:///dir`` names the directory Dynamo's processes share (their
``DYN_FILE_KV``; Dynamo's default is ``$TMPDIR/dynamo_store_kv``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import unquote, urlsplit

from dynamod.errors import ConfigError

ETCD: Final = "dynamo+etcd"
FILE: Final = "dynamo+file"
SCHEMES: Final = (ETCD, FILE)
ETCD_FORM: Final = "dynamo+etcd://host[:port][,host[:port]...][?parameters]"
FILE_FORM: Final = "dynamo+file:///absolute/directory"


@dataclass(frozen=True)
class DynamoUrl:
    """A parsed Dynamo fleet URL: the etcd URL our etcd store opens, or the directory."""

    url: str
    etcd: str = ""
    root: Path | None = None


def is_dynamo(url: str) -> bool:
    return url.split("://", 1)[0] in SCHEMES


def parse_url(url: str) -> DynamoUrl:
    """Parse a Dynamo fleet URL; ``ConfigError`` says what is wrong. Reads no file."""
    scheme = url.split("://", 1)[0]
    if scheme == ETCD:
        return _etcd(url)
    if scheme == FILE:
        return _file(url)
    raise ConfigError(f"store URL {url!r} is not a Dynamo fleet's; use {ETCD_FORM} or {FILE_FORM}")


def check_url(url: str) -> None:
    """What opening would refuse before connecting: the URL and the files it names."""
    parsed = parse_url(url)
    if parsed.etcd:
        from dynamod.store.etcd.url import parse_url as parse_etcd_url

        parse_etcd_url(parsed.etcd).check()


def _etcd(url: str) -> DynamoUrl:
    from dynamod.store.etcd.url import parse_url as parse_etcd_url  # loads the etcd client

    inner = url.removeprefix("dynamo+")
    target = parse_etcd_url(inner)
    if target.root:
        raise ConfigError(
            f"store URL {target.url!r} names the key prefix {target.root.rstrip('/')!r}; Dynamo "
            f"keeps its keys at the root of etcd, so the form is {ETCD_FORM}"
        )
    return DynamoUrl(f"dynamo+{target.url}", etcd=inner)


def _file(url: str) -> DynamoUrl:
    parts = urlsplit(url)
    path = unquote(parts.path)
    if parts.netloc or parts.query or parts.fragment or not path.startswith("/"):
        raise ConfigError(f"store URL {url!r} is malformed; the form is {FILE_FORM}")
    return DynamoUrl(url, root=Path(path))
