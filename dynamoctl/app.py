"""The dynamoctl command tree: the root with the global options, one sub-app per noun.

``command()`` builds the click command that ``main`` runs and that ``scripts/docs.py``
reads to write the man page and the completion scripts. It repeats the global options
on every leaf command (``-o`` and ``--no-headers`` shown in its help, the others hidden),
so kubectl's ``dynamoctl workers ls -o json`` works as well as ``dynamoctl -o json workers
ls``.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Iterator, Sequence
from typing import Annotated, Any

import typer
import typer.main

from dynamoctl import options
from dynamod import __version__

HELP = """Operate dynamod: list workers, change their taints, watch discovery events, explain
routing decisions, keep pool policies, watch the fleet live (top).

Every command talks to dynamod's gRPC API (--endpoint). Global options may come before the
command or after it. Tables go to stdout, diagnostics to stderr; -o json|yaml|name is for
scripts. Exit status: 0 ok, 1 the operation failed, 2 usage, 3 dynamod unreachable."""

EPILOG = "See dynamoctl(1) for selectors, output formats, the config file and examples."

VISIBLE_ON_LEAVES = ("output", "no_headers")

# Each command: its module, the attribute there, and whether that is a sub-app (a noun with
# verbs) or one command. Imported only when the command tree is built with it.
COMMANDS: dict[str, tuple[str, str, bool]] = {
    "workers": ("dynamoctl.commands.workers", "app", True),
    "taints": ("dynamoctl.commands.taints", "app", True),
    "events": ("dynamoctl.commands.events", "app", True),
    "route": ("dynamoctl.commands.route", "app", True),
    "pools": ("dynamoctl.commands.pools", "app", True),
    "status": ("dynamoctl.commands.status", "status", False),
    "top": ("dynamoctl.commands.top", "top", False),
    "config": ("dynamoctl.commands.config", "app", True),
    "completion": ("dynamoctl.commands.completion", "completion", False),
}
ORDER = tuple(COMMANDS)


def _app(names: Sequence[str]) -> typer.Typer:
    """The root app with the commands ``names``, in a fresh ``Typer`` (building it twice
    must not register anything twice)."""
    app = typer.Typer(
        name="dynamoctl",
        help=HELP,
        epilog=EPILOG,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        no_args_is_help=True,
        context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    )
    app.callback()(root)
    for name in names:
        module, attribute, group = COMMANDS[name]
        found = getattr(importlib.import_module(module), attribute)
        if group:
            app.add_typer(found, name=name)
        else:
            app.command(name)(found)
    return app


def _version(value: bool) -> None:
    if value:
        typer.echo(f"dynamoctl {__version__}")
        raise typer.Exit


Version = Annotated[
    bool,
    typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
]


def root(
    endpoint: options.Endpoint = None,
    token_file: options.TokenFile = None,
    tls: options.Tls = False,
    cacert: options.Cacert = None,
    cert: options.Cert = None,
    cert_key: options.CertKey = None,
    timeout: options.TimeoutOption = options.DEFAULT_TIMEOUT,
    output: options.Output = "table",
    no_headers: options.NoHeaders = False,
    debug: options.Debug = False,
    context: options.ContextOption = None,
    version: Version = False,
) -> None:
    """The global options; commands read them with ``options.from_context``."""


def command(only: str | None = None) -> Any:
    """The click command tree, ready to run (see the module docstring). With ``only``, a
    command's name, the tree holds that command alone: running it imports and builds
    nothing else (``main`` passes the command it finds on the command line)."""
    names = ORDER if only is None else (only,)
    cli: Any = typer.main.get_command(_app(names))
    cli.commands = {name: cli.commands[name] for name in names}
    shared = [p for p in cli.params if p.name in options.FIELDS]
    for leaf in leaves(cli):
        _plain_arguments(leaf)
        leaf.params.extend(_leaf_copy(p) for p in shared)
    return cli


def _plain_arguments(leaf: Any) -> None:
    """typer shows Python types after argument names ("TAINT <list[str]>"); the metavar
    and the help already say what goes there."""
    for param in leaf.params:
        if param.param_type_name == "argument":
            param.display_type_rich = lambda ctx: None


def invoked(argv: Sequence[str]) -> str | None:
    """The command ``argv`` runs, when that is plain: the first word after the global
    options (and their values) that names a command; None when in doubt (an option the
    root does not know, no command), and then the whole tree is built."""
    takes_value = {"-e", "--endpoint", "--token-file", "--cacert", "--cert", "--cert-key",
                   "--timeout", "-o", "--output", "--context"}  # fmt: skip
    flags = {"--tls", "--no-headers", "--debug"}
    words = iter(argv)
    for word in words:
        if word in takes_value:
            next(words, None)
        elif word in flags or (word.startswith("--") and word.partition("=")[0] in takes_value):
            continue
        elif word.startswith("-"):
            return None
        else:
            return word if word in COMMANDS else None
    return None


def leaves(command: Any) -> Iterator[Any]:
    subcommands = getattr(command, "commands", None)
    if subcommands is None:
        yield command
        return
    for sub in subcommands.values():
        yield from leaves(sub)


def _leaf_copy(param: Any) -> Any:
    """The root's option, for use after a leaf command's name."""
    leaf = copy.copy(param)
    leaf.envvar = None
    leaf.expose_value = False
    leaf.is_eager = False
    leaf.hidden = param.name not in VISIBLE_ON_LEAVES
    leaf.callback = options.override
    leaf.show_default = False
    return leaf
