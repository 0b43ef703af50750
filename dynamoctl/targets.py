"""Which workers a command acts on: one id (a unique prefix is enough), the workers a
selector matches (``-l``), or all of them (``--all``). The options are declared here once
and shared by every command that takes them; ``target()`` checks the combination (a usage
error) and ``selection.check_selector()`` the selector itself, both before anything is
sent: the CLI side's one check of each (the daemon checks its own side).
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from dynamoctl import shells
from dynamoctl.options import UsageError
from dynamod.targets import Target

SELECTOR_HELP = (
    "Only workers matching SELECTOR: comma-separated terms, each TAINT, !TAINT, "
    "FIELD=VALUE or FIELD!=VALUE (fields: model, namespace, component, endpoint, id, host); "
    'a taint holding , ! = or " goes in double quotes ("gpu,h100"). '
    "See SELECTORS in dynamoctl(1)."
)

SelectorOption = Annotated[
    str | None,
    typer.Option(
        "--selector",
        "-l",
        help=SELECTOR_HELP,
        metavar="SELECTOR",
        autocompletion=shells.selectors,
    ),
]
AllWorkers = Annotated[bool, typer.Option("--all", help="Every worker (asks first unless --yes).")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask before changing --all.")]
DryRun = Annotated[
    bool,
    typer.Option("--dry-run", help="Show what would change (before and after); write nothing."),
]


def check_revision(value: int | None) -> int | None:
    """``--if-revision``: a store revision, so 1 or more."""
    if value is not None and value < 1:
        raise typer.BadParameter(f"{value} is not a store revision; revisions start at 1")
    return value


IfRevision = Annotated[
    int | None,
    typer.Option(
        "--if-revision",
        help="Change only if the worker's record is still at revision N (optimistic lock; "
        "see REVISION in -o wide; a store revision, 1 or more).",
        metavar="N",
        callback=check_revision,
    ),
]
WorkerId = Annotated[
    str,
    typer.Argument(
        help="Worker id, or any unique prefix of it.",
        metavar="ID",
        autocompletion=shells.worker_ids,
    ),
]


def target(
    worker: str | None,
    selector: str | None,
    all_workers: bool,
    if_revision: int | None = None,
) -> Target:
    """The one ``Target`` named on the command line, or a usage error saying what to
    name. The selector itself is checked where the command runs (``selection.check_selector``)."""
    named = [worker is not None, selector is not None, all_workers]
    if named.count(True) != 1:
        what = "both" if named.count(True) > 1 else "none"
        raise UsageError(
            f"name the workers with exactly one of ID, -l SELECTOR or --all (got {what})"
        )
    if if_revision is not None and worker is None:
        raise UsageError("--if-revision needs a single worker ID, not -l or --all")
    return Target(worker, selector, all_workers, if_revision)


def check_all(chosen: Target, dry_run: bool, yes: bool) -> None:
    """--all changes every worker: it needs --yes, or a terminal to ask on."""
    if chosen.all and not (yes or dry_run or sys.stdin.isatty()):
        raise UsageError(
            "--all changes every worker and nobody can be asked (stdin is not a terminal); "
            "add --yes"
        )
