"""The global options: what they are, where they come from, and the one object commands read.

Precedence is flags > environment > config file > defaults. The file
(``fastpath.config_path``) is ``$XDG_CONFIG_HOME/dynamoctl/config.toml``
(``~/.config/dynamoctl/config.toml`` when ``XDG_CONFIG_HOME`` is unset), or the path in
``DYNAMOCTL_CONFIG``. It holds top-level keys named like the options (``endpoint =
"10.0.0.5:7070"``, ``token_file = "~/.dynamo-token"``, ``output = "wide"``, ...); it becomes
click's ``default_map``, so click itself applies the precedence. A malformed file or an
unknown key is refused with a message naming both. How the file is read, the environment
variables and the default endpoint live in ``dynamod.client.endpoint``, so a Python program
using ``dynamod.client`` gets the same defaults (its ``config_path`` and
``fastpath.config_path`` agree: a test holds them to it).

kubectl habit: a global option may also follow the command (``dynamoctl workers ls -o
json``); a value given there wins over one given before the command.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from dynamoctl.invocation import FIELDS, OUTPUTS, Options
from dynamod.client.endpoint import DEFAULT_TIMEOUT, load_config

# The root command and the commands use these from here.
__all__ = ["DEFAULT_TIMEOUT", "FIELDS", "OUTPUTS", "Options", "load_config"]

OVERRIDES = "dynamoctl.overrides"  # ctx.meta key: global options given after the command
ENDPOINT_HELP = (
    "dynamod's gRPC endpoint: unix:///PATH (or /PATH) or HOST:PORT. Default: the daemon's "
    "unix socket, $RUNTIME_DIRECTORY/dynamod.sock, else /run/dynamod/dynamod.sock when "
    "writable, else $XDG_RUNTIME_DIR/dynamod/dynamod.sock, else /tmp/dynamod-UID/dynamod.sock."
)


class UsageError(typer.BadParameter):
    """A command line that cannot be run as given: click prints it after the usage line
    and exits 2. (A ``BadParameter`` without its "Invalid value for" preamble.)"""

    def format_message(self) -> str:
        return self.message


def check_output(value: str) -> str:
    """``-o`` must name a known format, or be ``jsonpath=…`` / ``custom-columns=…`` with
    a template that parses; a usage error otherwise."""
    if value.partition("=")[0] in ("jsonpath", "custom-columns"):
        from dynamoctl.jsonpath import Shape, TemplateError

        try:
            Shape(value)
        except TemplateError as exc:
            raise typer.BadParameter(str(exc)) from None
        return value
    if value not in OUTPUTS:
        shaped = "jsonpath=TEMPLATE, custom-columns=SPEC"
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(OUTPUTS)}, {shaped}")
    return value


def check_timeout(value: float) -> float:
    if not value > 0:
        raise typer.BadParameter(f"{value} is not a number of seconds above 0")
    return value


CHECKS: dict[str, Callable[[Any], Any]] = {"output": check_output, "timeout": check_timeout}


def _outputs(incomplete: str) -> list[str]:
    return [o for o in OUTPUTS if o.startswith(incomplete)]


# The global options as typer declarations. ``app.py`` puts them on the root command and
# repeats them (hidden, except the output ones) on every leaf command.
Endpoint = Annotated[
    str | None,
    typer.Option(
        "--endpoint", "-e", envvar="DYNAMO_ENDPOINT", help=ENDPOINT_HELP, metavar="ENDPOINT"
    ),
]
TokenFile = Annotated[
    Path | None,
    typer.Option(
        envvar="DYNAMO_TOKEN_FILE",
        help="File holding the bearer token (dynamod requires one on TCP).",
        metavar="FILE",
    ),
]
Tls = Annotated[
    bool,
    typer.Option(
        "--tls", envvar="DYNAMO_TLS", help="Use TLS on TCP, with the system's CA certificates."
    ),
]
Cacert = Annotated[
    Path | None,
    typer.Option(
        envvar="DYNAMO_CACERT", help="CA certificate to verify dynamod (implies TLS).",
        metavar="FILE",
    ),
]  # fmt: skip
Cert = Annotated[
    Path | None,
    typer.Option(
        envvar="DYNAMO_CERT", help="Client certificate for mutual TLS (implies TLS).",
        metavar="FILE",
    ),
]  # fmt: skip
CertKey = Annotated[
    Path | None,
    typer.Option(
        envvar="DYNAMO_CERT_KEY",
        help="Private key of the client certificate.",
        metavar="FILE",
    ),
]
TimeoutOption = Annotated[
    float,
    typer.Option(
        envvar="DYNAMO_TIMEOUT",
        callback=check_timeout,
        help="Seconds each call to dynamod may take.",
        metavar="SECONDS",
    ),
]
Output = Annotated[
    str,
    typer.Option(
        "--output",
        "-o",
        callback=check_output,
        help="Output format: table, wide, json, yaml, name, jsonpath=TEMPLATE (kubectl's, "
        "e.g. '{.items[*].id}') or custom-columns=HEADER:.path,... (e.g. ID:.id,STATE:.state).",
        metavar="FORMAT",
        autocompletion=_outputs,
    ),
]


def contexts(incomplete: str) -> list[str]:
    """The config file's context names (Tab after --context)."""
    from dynamoctl.fastpath import config_path
    from dynamod.client.endpoint import read_config
    from dynamod.errors import ConfigError

    try:
        names = read_config(config_path()).contexts
    except ConfigError:
        return []
    return sorted(n for n in names if n.startswith(incomplete))


ContextOption = Annotated[
    str | None,
    typer.Option(
        envvar="DYNAMO_CONTEXT",
        help="Use this context of the config file ([contexts.NAME]) instead of its "
        "current_context (see dynamoctl config).",
        metavar="NAME",
        autocompletion=contexts,
    ),
]
NoHeaders = Annotated[bool, typer.Option("--no-headers", help="Leave out table headers.")]
Debug = Annotated[bool, typer.Option("--debug", help="Show tracebacks and debug logs on errors.")]


def from_context(ctx: typer.Context) -> Options:
    """The options in force for the command of ``ctx``: the root command's values, then
    any given after the command name. Works during completion too, when no callback ran."""
    root = ctx.find_root()
    given = {k: v for k, v in root.params.items() if k in FIELDS and v is not None}
    overrides: dict[str, Any] = ctx.meta.get(OVERRIDES, {})
    return replace(Options(**given), **overrides)


def override(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """Callback of a global option repeated on a leaf command: a value typed there wins."""
    name = param.name or ""
    source = ctx.get_parameter_source(name)
    if source is not None and source.name == "COMMANDLINE":
        check = CHECKS.get(name)
        ctx.meta.setdefault(OVERRIDES, {})[name] = check(value) if check else value
    return value
