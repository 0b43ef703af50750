"""The ``dynamoctl`` entry point: the config file, shell completion, then the command.

Errors inside a command are handled by ``session.execute`` (the one boundary for
everything that talks to the daemon) and usage errors by click (exit 2). What is left here
is start-up: what the command tree's snapshot can answer without typer (``fastpath``:
help, the version, completion of names), a broken config file (exit 2), and answering
shell completion before any command runs.
"""

from __future__ import annotations

import os
import sys

from dynamoctl import exits, fastpath


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    answered = fastpath.answer(args, os.environ)
    if answered is not None:
        return answered

    from dynamoctl import coercion, shells
    from dynamoctl.app import command, invoked
    from dynamoctl.options import load_config
    from dynamod.errors import ConfigError

    coercion.install()  # this process only: typer's parameters without pydantic
    try:
        default_map = load_config(fastpath.config_path(), chosen_context(args))
    except ConfigError as exc:
        sys.stderr.write(f"dynamoctl: error: {exc}\n")
        return exits.USAGE
    instruction = os.environ.get(fastpath.COMPLETE_VAR)
    if instruction:
        return shells.respond(command(), instruction, default_map)
    cli = command(invoked(args))
    # Standalone mode: click prints usage errors (exit 2) and ends with SystemExit.
    cli.main(args, prog_name=fastpath.PROG, default_map=default_map)
    return exits.OK


def chosen_context(args: list[str]) -> str | None:
    """``--context NAME`` wherever it is on the command line (before or after the command:
    the config file is read before click parses anything), else ``DYNAMO_CONTEXT``."""
    for at, word in enumerate(args):
        if word == "--":
            break
        if word == "--context" and at + 1 < len(args):
            return args[at + 1]
        if word.startswith("--context="):
            return word.partition("=")[2]
    return os.environ.get("DYNAMO_CONTEXT") or None


if __name__ == "__main__":
    sys.exit(main())
