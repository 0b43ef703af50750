"""The shell completions and the man pages, generated from the live CLIs.

* ``completions/dynamoctl.bash``, ``completions/_dynamoctl``, ``completions/dynamoctl.fish``
  are exactly what ``dynamoctl completion SHELL`` prints.
* ``man/dynamoctl.1``, ``man/dynamod.8``, ``man/dynamo-worker.1`` are roff written by hand
  (description, examples, signals, files, ...) with generated regions between the lines
  ``.\\" BEGIN GENERATED <name>`` and ``.\\" END GENERATED <name>``: the title line, the
  synopsis, the options and commands (from the typer apps), dynamoctl's SELECTORS (the
  docstring of ``dynamod.selectors``), its ENVIRONMENT variables and EXIT STATUS
  (``dynamoctl.exits``). Only those regions are rewritten; edit the prose in the page.

``scripts/generate.py`` calls ``generated()`` for both ``--check`` and regeneration.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SHELL_FILES = {
    "bash": "completions/dynamoctl.bash",
    "zsh": "completions/_dynamoctl",
    "fish": "completions/dynamoctl.fish",
}
MARK = re.compile(r'^\.\\" (BEGIN|END) GENERATED ([a-z-]+)$')
TYPE_NAMES = {  # typer's "<type>" metavars, in words a man page reader expects
    "str": "TEXT",
    "list[str]": "TEXT",
    "int": "INTEGER",
    "float": "NUMBER",
    "path": "PATH",
}


def generated() -> dict[str, str]:
    """{path relative to the repository: content} for every file made here."""
    return {**completions(), **man_pages()}


def completions() -> dict[str, str]:
    from dynamoctl import shells
    from dynamoctl.app import command

    cli = command()
    return {path: shells.script(cli, shell) for shell, path in SHELL_FILES.items()}


# roff


def chars(text: str) -> str:
    """Backslashes and minus signs escaped; characters beyond ASCII as groff escapes."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "".join(c if ord(c) < 128 else f"\\[u{ord(c):04X}]" for c in text)


def protect(text: str) -> str:
    """No line may be taken for a request: a leading '.' or "'" gets a zero-width \\&."""
    lines = text.split("\n")
    return "\n".join("\\&" + ln if ln.startswith((".", "'")) else ln for ln in lines)


def esc(text: str) -> str:
    return protect(chars(text))


def inline(text: str) -> str:
    """``literal`` → bold; everything else escaped."""
    parts = re.split(r"``(.+?)``", text)
    return protect(
        "".join(f"\\fB{chars(p)}\\fR" if i % 2 else chars(p) for i, p in enumerate(parts))
    )


def paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs, each joined into one line."""
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]


def prose(text: str) -> str:
    return "\n.PP\n".join(inline(p) for p in paragraphs(text))


def option_words(opts: str) -> str:
    """``-e, --endpoint ENDPOINT`` → bold option names, italic values."""
    words = []
    for word in opts.split():
        comma = "," if word.endswith(",") else ""
        bare = word.rstrip(",")
        typed = re.fullmatch(r"<(.+)>", bare)
        if typed:
            bare = TYPE_NAMES.get(typed.group(1), typed.group(1).upper())
        if bare.startswith("-"):
            words.append(f"\\fB{esc(bare)}\\fR{comma}")
        elif bare == "/":
            words.append("/")
        else:
            words.append(f"\\fI{esc(bare)}\\fR{comma}")
    return " ".join(words)


def entry(opts: str, help_text: str) -> str:
    return f".TP\n{option_words(opts)}\n{inline(' '.join(help_text.split()))}"


def params(command: Any, ctx: Any, keep: Callable[[Any], bool] = lambda p: True) -> str:
    """A .TP entry per visible argument and option, arguments first."""
    chosen = [p for p in command.get_params(ctx) if keep(p) and not getattr(p, "hidden", False)]
    ordered = sorted(chosen, key=lambda p: p.param_type_name != "argument")
    records = [p.get_help_record(ctx) for p in ordered]
    return "\n".join(entry(*r) for r in records if r is not None)


def usage(command: Any, ctx: Any, path: Sequence[str]) -> str:
    names = " ".join(f"\\fB{esc(n)}\\fR" for n in path)
    # typer writes a required argument as {ID}; a man page writes it as ID
    shown = [re.sub(r"\{(\w+)\}", r"\1", p) for p in command.collect_usage_pieces(ctx)]
    pieces = " ".join(f"\\fI{esc(p)}\\fR" for p in shown)
    return f"{names} {pieces}".strip()


def title(name: str, section: int, manual: str) -> str:
    from dynamod import __version__

    return f'.TH {name.upper()} {section} "" "dynamod {__version__}" "{manual}"'


def contexts(command: Any, name: str) -> Any:
    import typer

    return typer.Context(command, info_name=name)


def subcommands(
    group: Any, ctx: Any, path: tuple[str, ...]
) -> Iterable[tuple[Any, Any, tuple[str, ...]]]:
    """(command, context, path) for every leaf under ``group``, in help order."""
    import typer

    for name, sub in group.commands.items():
        sub_ctx = typer.Context(sub, info_name=name, parent=ctx)
        if hasattr(sub, "commands"):
            yield from subcommands(sub, sub_ctx, (*path, name))
        else:
            yield sub, sub_ctx, (*path, name)


def sections(
    leaves: Iterable[tuple[Any, Any, tuple[str, ...]]], keep: Callable[[Any], bool]
) -> str:
    out = []
    for command, ctx, path in leaves:
        out.append(f'.SS "{esc(" ".join(path[1:]))}"')
        out.append(usage(command, ctx, path))
        out.append(".PP\n" + prose(command.help or ""))
        out.append(params(command, ctx, keep))
    return "\n".join(line for line in out if line)


# the pages


def dynamoctl_regions() -> dict[str, str]:
    from dynamoctl import exits, options
    from dynamoctl.app import command
    from dynamod import selectors

    cli = command()
    ctx = contexts(cli, "dynamoctl")
    leaves = list(subcommands(cli, ctx, ("dynamoctl",)))

    def own(param: Any) -> bool:
        """Not the leaf copies of the global options, nor each command's --help."""
        return param.callback is not options.override and param.name != "help"

    synopsis = [usage(cli, ctx, ("dynamoctl",))] + [".br\n" + usage(c, x, p) for c, x, p in leaves]
    return {
        "title": title("dynamoctl", 1, "User Commands"),
        "synopsis": "\n".join(synopsis),
        "options": params(cli, ctx),
        "commands": sections(leaves, own),
        "selectors": rst(selectors.__doc__ or ""),
        "environment": environment(cli),
        "exit-status": "\n".join(
            f".TP\n.B {code}\n{esc(text)}" for code, text in exits.MEANINGS.items()
        ),
    }


def environment(cli: Any) -> str:
    """One entry per option that reads an environment variable."""
    out = []
    for param in cli.params:
        if param.envvar:
            flag = max(param.opts, key=len)
            out.append(f".TP\n.B {esc(param.envvar)}\nThe default of \\fB{esc(flag)}\\fR.")
    return "\n".join(out)


def rst(docstring: str) -> str:
    """A module docstring's paragraphs and ``*`` bullets, in roff."""
    body = docstring.split("\n", 1)[1] if "\n" in docstring else ""
    out = []
    for block in paragraphs(body.replace("\n* ", "\n\n* ")):
        if block.startswith("* "):
            out.append(f'.IP "\\(bu" 2\n{inline(block[2:])}')
        else:
            out.append(f".PP\n{inline(block)}")
    return "\n".join(out)


def dynamod_regions() -> dict[str, str]:
    import typer.main

    from dynamod.main import app

    cli = typer.main.get_command(app)
    ctx = contexts(cli, "dynamod")
    leaves = list(subcommands(cli, ctx, ("dynamod",)))
    synopsis = [usage(cli, ctx, ("dynamod",))] + [".br\n" + usage(c, x, p) for c, x, p in leaves]
    return {
        "title": title("dynamod", 8, "System Administration"),
        "synopsis": "\n".join(synopsis),
        "options": params(cli, ctx),
        "commands": sections(leaves, lambda p: p.name != "help"),
    }


def worker_regions() -> dict[str, str]:
    import typer.main

    from dynamod.worker.main import app

    cli = typer.main.get_command(app)
    ctx = contexts(cli, "dynamo-worker")
    return {
        "title": title("dynamo-worker", 1, "User Commands"),
        "synopsis": usage(cli, ctx, ("dynamo-worker",)),
        "options": params(cli, ctx),
        "environment": environment(cli),
    }


PAGES: dict[str, Callable[[], dict[str, str]]] = {
    "man/dynamoctl.1": dynamoctl_regions,
    "man/dynamod.8": dynamod_regions,
    "man/dynamo-worker.1": worker_regions,
}


def man_pages() -> dict[str, str]:
    out = {}
    for rel, build in PAGES.items():
        path = ROOT / rel
        if not path.exists():
            raise FileNotFoundError(
                f"{rel} is missing; it holds the hand-written prose around the generated "
                "regions, so restore it from git rather than generating it"
            )
        out[rel] = splice(path.read_text(), build(), rel)
    return out


def splice(text: str, regions: dict[str, str], rel: str) -> str:
    """``text`` with every generated region's body replaced by ``regions[name]``."""
    out: list[str] = []
    inside: str | None = None
    seen: list[str] = []
    for line in text.split("\n"):
        mark = MARK.match(line)
        if inside is None:
            out.append(line)
            if mark and mark.group(1) == "BEGIN":
                inside = _begin(mark.group(2), regions, rel, seen)
                out.append(regions[inside])
        elif mark and mark.group(1) == "END" and mark.group(2) == inside:
            out.append(line)
            inside = None
    missing = [name for name in regions if name not in seen]
    if inside is not None or missing:
        raise ValueError(f"{rel}: region {inside or missing[0]!r} is not closed or is missing")
    return "\n".join(out)


def _begin(name: str, regions: dict[str, str], rel: str, seen: list[str]) -> str:
    if name not in regions or name in seen:
        raise ValueError(f"{rel}: unknown or repeated generated region {name!r}")
    seen.append(name)
    return name
