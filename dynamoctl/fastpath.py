"""Start-up without typer: ``--help``, ``--version`` and Tab completion of command and
option names, answered from a snapshot of the command tree.

dynamoctl runs on every Tab, and importing typer and building the command tree costs more
than Python's own start-up several times over. So ``main`` first asks ``answer``, which
knows only ``os`` and ``sys`` and the snapshot (``dynamoctl/generated/``, written
from the live CLI by ``python -m scripts.generate``; a test fails when it is stale, and
``tests/cli/test_fastpath.py`` compares every answer with the live CLI's). What it answers,
it answers byte for byte as the live CLI would; everything else returns None and goes to
the live CLI:

* help, only for a command path followed by ``--help`` / ``-h``, at a terminal width the
  snapshot holds (80 columns, the width of a pipe, and 100 or more), and only when there is
  no config file (its values show in the help as defaults);
* completion (``_DYNAMOCTL_COMPLETE=<shell>_complete``), only when the words before the one
  being completed are a command path, and the word is a command name or an option name
  (not an option's value, not an argument: those may need the daemon), and nothing is
  quoted or escaped.
"""

from __future__ import annotations

import os
import sys

# typing and collections.abc cost more to import than this whole answer: annotations only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path

PROG = "dynamoctl"
COMPLETE_VAR = "_DYNAMOCTL_COMPLETE"
HELP_FLAGS = ("--help", "-h")
MAX_CONTENT_WIDTH = 100  # context_settings in app.py
HELP_COLUMNS = (80, MAX_CONTENT_WIDTH)  # the terminal widths the snapshot is rendered at
QUOTING = ("'", '"', "\\")


def answer(argv: list[str], environ: Mapping[str, str]) -> int | None:
    """Answer from the snapshot and return the exit status, or None: ask the live CLI."""
    instruction = environ.get(COMPLETE_VAR)
    if instruction:
        return _complete(instruction, environ)
    if argv == ["--version"]:
        from dynamod import __version__

        sys.stdout.write(f"{PROG} {__version__}\n")
        return 0
    if argv and argv[-1] in HELP_FLAGS:
        return _help(argv[:-1], environ)
    return None


def config_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where dynamoctl's config file is looked for (it need not exist): ``DYNAMOCTL_CONFIG``,
    else ``$XDG_CONFIG_HOME/dynamoctl/config.toml``, else ``~/.config/dynamoctl/...``."""
    from pathlib import Path

    return Path(_config_file(os.environ if environ is None else environ))


def _config_file(environ: Mapping[str, str]) -> str:
    """``config_path`` without pathlib, whose import --help need not pay."""
    if environ.get("DYNAMOCTL_CONFIG"):
        return os.path.expanduser(environ["DYNAMOCTL_CONFIG"])
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "dynamoctl", "config.toml")


def help_width(columns: int) -> int:
    """The width click wraps help at on a terminal of ``columns``."""
    return max(min(columns, MAX_CONTENT_WIDTH) - 2, 50)


def terminal_columns(environ: Mapping[str, str]) -> int:
    """``shutil.get_terminal_size().columns`` (what click asks), without importing shutil,
    which loads the compression modules: ``COLUMNS``, else stdout's terminal, else 80."""
    try:
        columns = int(environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def _help(path: list[str], environ: Mapping[str, str]) -> int | None:
    if os.path.exists(_config_file(environ)):
        return None
    from dynamoctl.generated import help as snapshot

    width = help_width(terminal_columns(environ))
    text = snapshot.HELP.get(width, {}).get(" ".join(path))
    if text is None:
        return None
    sys.stdout.write(text)
    return 0


def completion_args(
    shell: str, environ: Mapping[str, str], split: Callable[[str], list[str]]
) -> tuple[list[str], str]:
    """(the words before the one being completed, without the program; that word), from
    the variables each shell's script sets (click's protocol)."""
    words = split(environ.get("COMP_WORDS", ""))
    if shell == "fish":
        incomplete = environ.get("COMP_CWORD", "")
        if incomplete:
            incomplete = (split(incomplete) or [""])[0]
        args = words[1:]
        if incomplete and args and args[-1] == incomplete:
            args.pop()
        return args, incomplete
    current = int(environ.get("COMP_CWORD", "0") or 0)
    incomplete = words[current] if 0 < current < len(words) else ""
    return words[1:current], incomplete


def formatted(shell: str, kind: str, value: str, help_text: str | None) -> str:
    """One completion as each shell's script reads it."""
    shown = " ".join((help_text or "").split())
    if shell == "zsh":
        escaped = value.replace(":", r"\:")
        return f"{kind}\n{escaped}\n{shown or '_'}"
    if shell == "fish":
        return f"{kind},{value}\t{shown}" if shown else f"{kind},{value}"
    return f"{kind},{value}"


def _complete(instruction: str, environ: Mapping[str, str]) -> int | None:
    shell, _, action = instruction.partition("_")
    if action != "complete" or shell not in ("bash", "zsh", "fish"):
        return None
    if any(c in environ.get("COMP_WORDS", "") + environ.get("COMP_CWORD", "") for c in QUOTING):
        return None
    try:
        args, incomplete = completion_args(shell, environ, str.split)
    except ValueError:  # COMP_CWORD is not a number: the live CLI says what it says
        return None
    items = _names(" ".join(args), "" if incomplete == "=" else incomplete)
    if items is None:
        return None
    answer = "\n".join(formatted(shell, "plain", value, text) for value, text in items)
    sys.stdout.write(answer + "\n" if answer else "")
    return 0


def _names(path: str, incomplete: str) -> list[tuple[str, str]] | None:
    """The command and option names click would offer at ``path`` for ``incomplete``;
    None when the answer is not a matter of names."""
    from dynamoctl.generated import names as snapshot

    options = snapshot.OPTIONS.get(path)
    if options is None or (incomplete.startswith("-") and "=" in incomplete):
        return None  # not a command path; or an option's value
    commands = snapshot.COMMANDS.get(path)
    if commands is None and not incomplete.startswith("-") and path in snapshot.ARGUMENTS:
        return None  # a leaf's argument: its completer may ask the daemon
    found = [(v, h) for v, h in commands or () if v.startswith(incomplete)]
    if incomplete and not incomplete[0].isalnum():
        found += [(v, h) for v, h in options if v.startswith(incomplete)]
    return found
