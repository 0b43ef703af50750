"""``dynamoctl completion bash|zsh|fish``: print a shell completion script."""

from __future__ import annotations

from typing import Annotated

import typer

from dynamoctl import shells

SHELL_HELP = """Print a shell completion script.

For SHELL: bash, zsh or fish.

Packages install these for you; by hand:
bash: source <(dynamoctl completion bash);
zsh: dynamoctl completion zsh > "${fpath[1]}/_dynamoctl";
fish: dynamoctl completion fish > ~/.config/fish/completions/dynamoctl.fish."""


def _shells(incomplete: str) -> list[str]:
    return [s for s in shells.SHELLS if s.startswith(incomplete)]


def completion(
    ctx: typer.Context,
    shell: Annotated[
        str, typer.Argument(help="bash, zsh or fish.", metavar="SHELL", autocompletion=_shells)
    ],
) -> None:
    if shell not in shells.SHELLS:
        raise typer.BadParameter(
            f"{shell!r} is not one of {', '.join(shells.SHELLS)}", param_hint="SHELL"
        )
    typer.echo(shells.script(ctx.find_root().command, shell), nl=False)


completion.__doc__ = SHELL_HELP
