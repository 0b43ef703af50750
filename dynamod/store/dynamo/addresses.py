"""Where a Dynamo worker's system port is: the one place its taint route lives.

Dynamo publishes no system address of its own. Its model card names the files of the
model (config, tokenizer, ...) by URLs served on the worker's system port
(``http://{DYN_SYSTEM_HOST}:{DYN_SYSTEM_PORT}/v1/metadata/...``), so by default the
address is the origin of those URLs; a card URL on an unspecified host (``0.0.0.0``,
``::``: a worker listening on every interface) takes the host of the worker's request
plane instead. An operator overrides that per worker (``by_id``: instance id in hex →
base URL) or for every worker with a template (``template``, e.g.
``http://{host}:9090``: ``{host}`` is the host of the worker's request-plane address,
``{id}`` its instance id in hex). The order is: the worker's own entry, the template, the
card.
"""

from __future__ import annotations

import string
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

from dynamod.errors import ConfigError

METADATA_PATH: Final = "/v1/metadata/"
PLACEHOLDERS: Final = frozenset({"host", "id"})
UNSPECIFIED: Final = frozenset({"0.0.0.0", "::", "[::]"})


@dataclass(frozen=True)
class SystemAddresses:
    """How to find a worker's system address; see the module docstring."""

    template: str = ""
    by_id: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.template:
            _check_template(self.template)
        for worker, address in self.by_id.items():
            _check_base(address, f"dynamo_system_addresses[{worker!r}]")
        object.__setattr__(self, "by_id", {k.lower(): v for k, v in self.by_id.items()})

    def of(self, instance: str, host: str, card: Mapping[str, Any]) -> str:
        """The base URL of worker ``instance``'s system port ("" when nothing names one):
        ``host`` is its request plane's host, ``card`` its ``card_json``."""
        given = self.by_id.get(instance.lower())
        if given:
            return given.rstrip("/")
        if self.template:
            return self.template.format(host=_bracketed(host), id=instance).rstrip("/")
        return from_card(card, host)


def from_card(card: Mapping[str, Any], host: str) -> str:
    """The origin of the card's first file URL on a system port, or ""."""
    for url in _urls(card):
        try:
            parts = urlsplit(url)
            port = f":{parts.port}" if parts.port else ""
        except ValueError:  # not a URL, or no port number: not one the worker serves
            continue
        if parts.scheme not in ("http", "https") or METADATA_PATH not in parts.path:
            continue
        if (parts.hostname or "") in UNSPECIFIED and host:
            return f"{parts.scheme}://{_bracketed(host)}{port}"
        return f"{parts.scheme}://{parts.netloc}"
    return ""


def _urls(obj: object) -> Iterator[str]:
    """Every ``"path"`` string in the card's file entries, in a stable order."""
    if isinstance(obj, Mapping):
        path = obj.get("path")
        if isinstance(path, str):
            yield path
        for key in sorted(k for k in obj if isinstance(k, str)):
            yield from _urls(obj[key])


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _check_template(template: str) -> None:
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise ConfigError(f"dynamo_system_address {template!r} is not a template: {exc}") from None
    unknown = sorted(names - PLACEHOLDERS)
    if unknown:
        raise ConfigError(
            f"dynamo_system_address {template!r} names {{{unknown[0]}}}; the placeholders are "
            "{host} (the worker's request-plane host) and {id} (its instance id in hex)"
        )
    _check_base(template.format(host="h", id="0"), "dynamo_system_address")


def _check_base(url: str, name: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{name} {url!r} must be an http:// or https:// URL with a host")
    if parts.path.strip("/") or parts.query or parts.fragment:
        raise ConfigError(
            f"{name} {url!r} must be the base URL of the system port (scheme, host, port), "
            "without a path: dynamod adds /engine/update/model_taints"
        )
