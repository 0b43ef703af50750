"""Where the daemon is and how to prove who you are: the same defaults for ``dynamoctl`` and
for Python programs. No gRPC here, so ``dynamoctl --help`` can read it for free.

Precedence: an explicit argument (a flag) > the environment > the config file > defaults.

* Environment: ``DYNAMO_ENDPOINT``, ``DYNAMO_TOKEN_FILE``, ``DYNAMO_TLS`` (``1``/``true``/
  ``yes``/``on`` or ``0``/``false``/``no``/``off``), ``DYNAMO_CACERT``, ``DYNAMO_CERT``,
  ``DYNAMO_CERT_KEY``, ``DYNAMO_TIMEOUT`` (seconds).
* Config file: ``$DYNAMOCTL_CONFIG``, else ``$XDG_CONFIG_HOME/dynamoctl/config.toml``
  (``~/.config/dynamoctl/config.toml``): top-level keys ``endpoint``, ``token_file``,
  ``tls``, ``cacert``, ``cert``, ``cert_key``, ``timeout``, and dynamoctl's display keys
  ``output`` and ``no_headers`` (a Python client ignores those). A malformed file or an
  unknown key is refused with a message naming both.
* Contexts, kubectl's habit for several fleets in one file: tables ``[contexts.NAME]``
  holding the same keys, and ``current_context = "NAME"``. The context in use is the one
  named by ``dynamoctl --context`` (or ``DYNAMO_CONTEXT``), else ``current_context``;
  its keys win over the top-level ones. A context that is not in the file is refused
  with the names that are.
* Default endpoint: the daemon's unix socket (``dynamod.paths``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynamod.api.error_status import from_status
from dynamod.errors import AnswerTimeoutError, ConfigError, DynamoError, UnreachableError
from dynamod.paths import default_socket

CONNECTION_KEYS = ("endpoint", "token_file", "tls", "cacert", "cert", "cert_key", "timeout")
DISPLAY_KEYS = ("output", "no_headers")
"""dynamoctl's own keys in the shared file."""
CONFIG_KEYS = CONNECTION_KEYS + DISPLAY_KEYS
ENVIRONMENT = {key: f"DYNAMO_{key.upper()}" for key in CONNECTION_KEYS}
PATH_KEYS = ("token_file", "cacert", "cert", "cert_key")
DEFAULT_TIMEOUT = 10.0
UPDATE_WAIT = 20.0
"""Seconds a daemon may spend on one worker's taint update on a caller's behalf, beyond
the call itself: an NVIDIA Dynamo worker's route answering (up to 5 s) and the store
showing the change (up to 10 s), with room to spare. An update's deadline is the client's
``timeout`` plus this, so the daemon's own error (the wait ran out) reaches the caller,
never a deadline of its own; a bulk update's stream waits that long for each outcome."""
_TRUE = ("1", "true", "t", "yes", "y", "on")
_FALSE = ("0", "false", "f", "no", "n", "off")


@dataclass(frozen=True)
class Credentials:
    token: str | None = None
    tls: bool = False
    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None

    def metadata(self) -> list[tuple[str, str]]:
        """What every call carries for the token (none without one): both clients send it."""
        return [("authorization", f"Bearer {self.token}")] if self.token else []


@dataclass(frozen=True)
class Connection:
    """Everything needed to dial the daemon: ``AsyncClient(**vars(connection))``.
    ``endpoint`` is as given (``target_of`` makes it a gRPC target)."""

    endpoint: str
    credentials: Credentials
    timeout: float


def default_endpoint() -> str:
    """The daemon's default unix socket (see ``dynamod.paths``)."""
    return "unix://" + str(default_socket())


def target_of(endpoint: str) -> str:
    """``/path`` → ``unix:///path``; ``unix://...`` and ``host:port`` stay as they are."""
    if endpoint.startswith("/"):
        return "unix://" + endpoint
    return endpoint


def unreachable(endpoint: str, details: str | None) -> UnreachableError:
    """What a client says when the daemon cannot be reached at ``endpoint`` (``details``:
    the transport's own words), the gRPC client and the light one alike."""
    return UnreachableError(
        f"cannot reach dynamod at {endpoint} ({details}); is it running? "
        "Set another endpoint with --endpoint or DYNAMO_ENDPOINT"
    )


def late(endpoint: str, within: float) -> AnswerTimeoutError:
    """What a client says when the daemon was reached but did not answer ``within`` s."""
    return AnswerTimeoutError(
        f"dynamod at {endpoint} is reachable but did not answer within {within:g} s; "
        "the call may still be carried out there (an update's audit line says). Allow "
        "longer with --timeout or DYNAMO_TIMEOUT"
    )


def call_error(
    endpoint: str,
    code: str,
    details: str | None,
    metadata: Sequence[object],
    *,
    within: float,
    connected: bool,
) -> DynamoError:
    """Both clients' rule for a call that failed with gRPC status ``code``: the daemon's
    own error as it sent it; a deadline while connected is ``late`` (the daemon was
    reached); anything else of the transport's is ``unreachable``."""
    error = from_status(code, details or "", metadata)
    if not isinstance(error, UnreachableError):
        return error
    if code == "DEADLINE_EXCEEDED" and connected:
        return late(endpoint, within)
    return unreachable(endpoint, details)


def config_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where the config file is looked for (it need not exist)."""
    env = os.environ if environ is None else environ
    if env.get("DYNAMOCTL_CONFIG"):
        return Path(env["DYNAMOCTL_CONFIG"]).expanduser()
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "dynamoctl" / "config.toml"


CONTEXT_KEYS = ("contexts", "current_context")
CONTEXT_VARIABLE = "DYNAMO_CONTEXT"


@dataclass(frozen=True)
class ConfigFile:
    """A config file as read: its top-level keys, its contexts, the current one."""

    path: Path
    top: dict[str, Any]
    contexts: dict[str, dict[str, Any]]
    current: str | None

    def values(self, context: str | None = None) -> dict[str, Any]:
        """The keys in force with ``context`` (None: the current one), paths expanded."""
        name = context or self.current
        chosen = dict(self.top)
        if name:
            if name not in self.contexts:
                known = ", ".join(sorted(self.contexts)) or "none"
                raise ConfigError(
                    f"context {name!r} is not in config file {str(self.path)!r} "
                    f"(its contexts: {known}); add a [contexts.{name}] table"
                )
            chosen.update(self.contexts[name])
        return {k: _expand(k, v) for k, v in chosen.items()}


def read_config(path: Path) -> ConfigFile:
    """The config file; an empty one when there is none."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return ConfigFile(path, {}, {}, None)
    except OSError as exc:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {exc.strerror}") from None
    import tomllib  # only when there is a file: its regular expressions cost a CLI run ~4 ms

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
    contexts = data.pop("contexts", {})
    current = data.pop("current_context", None)
    where = f"config file {str(path)!r}"
    if not isinstance(contexts, dict) or not all(isinstance(c, dict) for c in contexts.values()):
        raise ConfigError(f"{where}: contexts must be tables, [contexts.NAME]")
    if current is not None and not isinstance(current, str):
        raise ConfigError(f"{where}: current_context must be a context's name, a string")
    _known(data, where)
    for name, keys in contexts.items():
        _known(keys, f"{where}, context {name!r},")
    return ConfigFile(path, data, contexts, current)


def _known(data: Mapping[str, Any], where: str) -> None:
    unknown = sorted(set(data) - set(CONFIG_KEYS))
    if unknown:
        keys = ", ".join(CONFIG_KEYS + CONTEXT_KEYS)
        raise ConfigError(f"{where} has unknown key {unknown[0]!r}; known keys are {keys}")


def load_config(path: Path, context: str | None = None) -> dict[str, Any]:
    """The config file's keys and values in force with ``context`` (None: the file's
    current context, if any), paths expanded; ``{}`` when there is no file."""
    return read_config(path).values(context)


def _expand(key: str, value: Any) -> Any:
    if key in PATH_KEYS and isinstance(value, str):
        return str(Path(value).expanduser())
    return value


def resolve(
    endpoint: str | None = None,
    *,
    token_file: str | Path | None = None,
    tls: bool | None = None,
    cacert: str | Path | None = None,
    cert: str | Path | None = None,
    cert_key: str | Path | None = None,
    timeout: float | None = None,
    environ: Mapping[str, str] | None = None,
) -> Connection:
    """The connection dynamoctl would make with these flags: each value from the argument,
    else the environment, else the config file, else the default. Unreadable files and
    invalid values raise ``ConfigError`` naming them."""
    env = os.environ if environ is None else environ
    given = {
        "endpoint": endpoint, "token_file": token_file, "tls": tls, "cacert": cacert,
        "cert": cert, "cert_key": cert_key, "timeout": timeout,
    }  # fmt: skip
    file: dict[str, Any] | None = None
    chosen: dict[str, Any] = {}
    for key, value in given.items():
        if value is None and env.get(ENVIRONMENT[key]):
            value = _from_env(key, env[ENVIRONMENT[key]])
        if value is None:
            if file is None:
                file = load_config(config_path(env), env.get(CONTEXT_VARIABLE) or None)
            value = file.get(key)
        chosen[key] = value
    return connection(**chosen)


def completed(
    endpoint: str | None, credentials: Credentials | None, timeout: float | None
) -> Connection:
    """A client's arguments, what is not given (None) resolved as dynamoctl would."""
    if endpoint is not None and credentials is not None and timeout is not None:
        return Connection(endpoint, credentials, timeout)
    found = resolve(endpoint, timeout=timeout)
    return Connection(
        found.endpoint, found.credentials if credentials is None else credentials, found.timeout
    )


def connection(
    *,
    endpoint: str | None,
    token_file: str | Path | None,
    tls: bool | None,
    cacert: str | Path | None,
    cert: str | Path | None,
    cert_key: str | Path | None,
    timeout: float | None,
) -> Connection:
    """A ``Connection`` from settled values (None: the default); reads the files named."""
    if (cert is None) != (cert_key is None):
        raise ConfigError("--cert and --cert-key must be given together (mutual TLS)")
    credentials = Credentials(
        token=_token(Path(token_file)) if token_file else None,
        tls=bool(tls),
        ca=read_file(Path(cacert), "--cacert") if cacert else None,
        cert=read_file(Path(cert), "--cert") if cert else None,
        key=read_file(Path(cert_key), "--cert-key") if cert_key else None,
    )
    seconds = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    if not seconds > 0:
        raise ConfigError(f"timeout {seconds:g} is not a number of seconds above 0")
    return Connection(endpoint or default_endpoint(), credentials, seconds)


def _token(path: Path) -> str:
    from dynamod.auth import read_token_file  # the daemon's token rules, when a file is named

    return read_token_file(path)


def read_file(path: Path, flag: str) -> bytes:
    try:
        return path.expanduser().read_bytes()
    except OSError as exc:
        raise ConfigError(f"{flag} {str(path)!r} cannot be read: {exc.strerror}") from None


def _from_env(key: str, raw: str) -> Any:
    name = ENVIRONMENT[key]
    if key == "tls":
        if raw.strip().lower() in _TRUE:
            return True
        if raw.strip().lower() in _FALSE:
            return False
        raise ConfigError(f"{name}={raw!r} is not a boolean; use 1/true/yes/on or 0/false/no/off")
    if key == "timeout":
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None
    return raw
