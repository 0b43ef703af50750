"""``dynamoctl config get-contexts|current-context|use-context``: the config file's
contexts, kubectl's way of keeping several fleets in one file (``dynamod.client.endpoint``
reads them). Nothing here talks to the daemon."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from dynamoctl import exits
from dynamoctl.options import contexts, from_context

app = typer.Typer(
    no_args_is_help=True,
    help="The config file's contexts: one per fleet ([contexts.NAME]), and the one in use.",
)

ContextName = Annotated[
    str,
    typer.Argument(help="A context of the config file.", metavar="NAME", autocompletion=contexts),
]
_CURRENT = re.compile(r"^current_context\s*=.*$\n?", re.MULTILINE)
_TABLE = re.compile(r"^\s*\[", re.MULTILINE)


def _file() -> Path:
    from dynamoctl.fastpath import config_path

    return config_path()


def _fail(message: str) -> typer.Exit:
    typer.echo(f"dynamoctl: error: {message}", err=True)
    return typer.Exit(exits.FAILED)


@app.command("get-contexts")
def get_contexts(ctx: typer.Context) -> None:
    """List the contexts of the config file.

    Columns: CURRENT (* for the one in use: --context, else current_context), NAME,
    ENDPOINT (the context's, else the file's top-level one, else the default socket)."""
    from dynamoctl.output import Printer
    from dynamod.client.endpoint import read_config

    options = from_context(ctx)
    found = read_config(_file())
    using = options.context or found.current
    rows = []
    for name in sorted(found.contexts):
        endpoint = found.values(name).get("endpoint") or "<default>"
        rows.append(["*" if name == using else "", name, str(endpoint)])
    printer = Printer(options.output, no_headers=options.no_headers)
    if options.output == "name":
        for row in rows:
            printer.line(row[1])
    elif printer.output in ("json", "yaml"):
        items = [{"name": r[1], "current": r[0] == "*", "endpoint": r[2]} for r in rows]
        printer.json(items) if printer.output == "json" else printer.yaml(items)
    elif rows:
        printer.table(["CURRENT", "NAME", "ENDPOINT"], rows)
    if not rows:
        printer.note(f"config file {str(found.path)!r} has no contexts ([contexts.NAME])")


@app.command("current-context")
def current_context(ctx: typer.Context) -> None:
    """Print the context in use (--context, else the file's current_context)."""
    from dynamod.client.endpoint import read_config

    found = read_config(_file())
    using = from_context(ctx).context or found.current
    if not using:
        raise _fail(f"config file {str(found.path)!r} sets no current_context")
    typer.echo(using)


@app.command("use-context")
def use_context(name: ContextName) -> None:
    """Make NAME the current context: writes current_context into the config file.

    The rest of the file is left as it is, comments included."""
    from dynamod.client.endpoint import read_config

    path = _file()
    found = read_config(path)
    if name not in found.contexts:
        known = ", ".join(sorted(found.contexts)) or "none"
        raise _fail(f"context {name!r} is not in config file {str(path)!r} (its contexts: {known})")
    text = path.read_text()
    line = f"current_context = {_quoted(name)}\n"
    head_end = m.start() if (m := _TABLE.search(text)) else len(text)
    head, rest = text[:head_end], text[head_end:]
    head = _CURRENT.sub(line, head, count=1) if _CURRENT.search(head) else line + head
    path.write_text(head + rest)
    typer.echo(f"switched to context {name!r}")


def _quoted(name: str) -> str:
    """A TOML basic string."""
    import json

    return json.dumps(name)
