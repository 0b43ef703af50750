"""The ``dynamoctl`` entry point: the config file, shell completion, then the command.

Errors inside a command are handled by ``session.execute`` (the one boundary for
everything that talks to the daemon) and usage errors by click (exit 2). What is left here
is start-up: what the command tree's snapshot can answer without typer (``fastpath``:
help, the version, completion of names), the commands scripts loop on, run without typer
when plainly given (``direct``), a broken config file (exit 2), and answering shell
completion before any command runs.
"""

from __future__ import annotations

import gc
import os
import sys

from dynamoctl import direct, exits, fastpath


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    answered = fastpath.answer(args, os.environ)
    if answered is not None:
        return answered
    if argv is None:
        # The program (not a caller of main): its imports make thousands of objects that
        # all stay alive, so the cyclic collector's passes over them find nothing and cost
        # ~6% of a run. A command that lasts (a stream; whatever typer runs) turns it on.
        gc.disable()
    answered = direct.run(args, os.environ)
    if answered is not None and argv is None:
        direct.leave(answered)
    if answered is not None:
        return answered
    gc.enable()
    return live(args)


def live(args: list[str]) -> int:
    """The live CLI (typer's): every command line ``fastpath`` and ``direct`` leave."""
    from dynamoctl import coercion, shells
    from dynamoctl.app import command, invoked
    from dynamoctl.options import load_config
    from dynamod.errors import ConfigError

    coercion.install()  # this process only: typer's parameters without pydantic
    try:
        default_map = load_config(fastpath.config_path(), direct.chosen_context(args, os.environ))
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


if __name__ == "__main__":
    sys.exit(main())
