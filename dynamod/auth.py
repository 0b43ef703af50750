"""Who may do what: bearer tokens with roles, and taint-prefix limits.

The tokens file is TOML::

    [[token]]
    name = "ops"                 # shows up in the audit log
    secret = "s3cr3t"            # the bearer token
    role = "write"               # "read" or "write"

    [[token]]
    name = "autoscaler"
    secret = "..."
    role = "write"
    prefixes = ["capacity/"]     # may only add or remove taints starting with these

A caller on the unix socket needs no token: the socket is created 0660, so file
permissions decide who may connect. On TCP a caller needs a bearer token, or a client
certificate verified against the configured CA (mTLS), which grants ``write``.
"""

from __future__ import annotations

import hmac
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dynamod.errors import ConfigError, PermissionDeniedError, UnauthenticatedError

Role = Literal["read", "write"]


@dataclass(frozen=True)
class Principal:
    name: str
    role: Role
    prefixes: tuple[str, ...] = ()
    peer: str = ""
    """Where this call came from, as the transport says (``ipv4:10.0.0.7:51234``,
    ``unix:``): set per call by the API, written on every audit line."""

    def require_write(self) -> None:
        if self.role != "write":
            raise PermissionDeniedError(
                f"{self.name!r} has read-only access; changing taints needs a write token"
            )

    def check_taints(self, changed: Iterable[str]) -> None:
        """Refuse a change that touches a taint outside this principal's prefixes."""
        if not self.prefixes:
            return
        for taint in sorted(changed):
            if not taint.startswith(self.prefixes):
                allowed = ", ".join(repr(p) for p in self.prefixes)
                raise PermissionDeniedError(
                    f"{self.name!r} may only change taints under {allowed}; "
                    f"{taint!r} is outside them"
                )


UNIX = Principal("unix-socket", "write")


def same_secret(given: str, secret: str) -> bool:
    """Constant-time comparison of a presented token with a secret. Works on bytes: a
    header may hold any bytes (HTTP servers decode them with surrogate escapes), and
    comparing ``str`` with non-ASCII characters is a ``TypeError`` in ``hmac``."""
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), secret.encode())


def check_bearer(token: str, where: str) -> str:
    """``token`` when it can travel as a bearer token (RFC 6750: visible ASCII, no spaces),
    else ``ConfigError`` naming ``where``. An HTTP header or gRPC metadata value cannot hold
    anything else, so a token that breaks this could never be presented."""
    bad = next((c for c in token if not "!" <= c <= "~"), None)
    if bad is not None:
        raise ConfigError(
            f"{where} holds a token with character {bad!r}; a bearer token is visible ASCII "
            "without spaces (RFC 6750)"
        )
    return token


def read_token_file(path: Path, flag: str = "--token-file") -> str:
    """The bearer token in the file ``path`` (surrounding whitespace dropped), checked;
    ``ConfigError`` naming ``flag`` and the file when it cannot be read, is empty or holds
    characters a token cannot carry."""
    where = f"{flag} {str(path)!r}"
    try:
        token = path.expanduser().read_bytes().decode(errors="replace").strip()
    except OSError as exc:
        raise ConfigError(f"{where} cannot be read: {exc.strerror}") from None
    if not token:
        raise ConfigError(f"{where} is empty")
    return check_bearer(token, where)


@dataclass(frozen=True)
class Tokens:
    entries: tuple[tuple[str, Principal], ...] = ()

    @classmethod
    def load(cls, path: Path | None) -> Tokens:
        if path is None:
            return cls()
        try:
            data = tomllib.loads(path.read_text())
        except OSError as exc:
            raise ConfigError(f"tokens file {str(path)!r} cannot be read: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"tokens file {str(path)!r} is not valid TOML: {exc}") from None
        return cls(tuple(_entry(path, i, e) for i, e in enumerate(data.get("token", []))))

    def authenticate(self, token: str) -> Principal:
        found = None
        for secret, principal in self.entries:
            if same_secret(token, secret):
                found = principal
        if found is None:
            raise UnauthenticatedError("the bearer token is not valid")
        return found

    def identify(self, *, peer: str, token: str | None, cert_name: str | None) -> Principal:
        if token:
            return self.authenticate(token)
        if peer.startswith("unix:"):
            return UNIX
        if cert_name:
            return Principal(f"cert:{cert_name}", "write")
        raise UnauthenticatedError(
            "a bearer token is required on TCP (dynamoctl --token-file FILE, or DYNAMO_TOKEN_FILE)"
        )


def _entry(path: Path, index: int, raw: object) -> tuple[str, Principal]:
    where = f"tokens file {str(path)!r}, token #{index + 1}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a table")
    secret, name, role = raw.get("secret"), raw.get("name"), raw.get("role", "read")
    prefixes = raw.get("prefixes", [])
    if not isinstance(secret, str) or len(secret) < 8:
        raise ConfigError(f"{where} needs a secret of at least 8 characters")
    check_bearer(secret, f"{where}'s secret")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where} needs a name")
    if role not in ("read", "write"):
        raise ConfigError(f"{where} has role {role!r}; use 'read' or 'write'")
    if not isinstance(prefixes, list) or not all(isinstance(p, str) and p for p in prefixes):
        raise ConfigError(f"{where} prefixes must be a list of non-empty strings")
    return secret, Principal(name, role, tuple(prefixes))
