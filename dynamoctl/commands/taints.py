"""``dynamoctl taints set|add|rm|clear``: change the caller-managed taints of workers.

Every change is a compare-and-swap in the daemon, so concurrent runs never clobber each
other (unlike ``kubectl taint``); ``--if-revision`` makes a single-worker change fail when
the record moved since you looked. The reserved ``dynamo.topology/`` taints are generated
from the worker's topology and can be neither set nor removed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from dynamoctl import shells
from dynamoctl.options import UsageError
from dynamoctl.targets import (
    AllWorkers,
    DryRun,
    IfRevision,
    SelectorOption,
    Yes,
    check_all,
    target,
)

if TYPE_CHECKING:
    from dynamod.taints import UpdateAction
    from dynamod.targets import Target

app = typer.Typer(
    no_args_is_help=True,
    help="Change worker taints: set (replace), add, rm, clear.",
)

WorkerArg = Annotated[
    str | None,
    typer.Argument(
        help="Worker id, or any unique prefix of it. Leave it out with -l or --all.",
        metavar="ID",
        autocompletion=shells.worker_ids,
        show_default=False,
    ),
]
TaintArgs = Annotated[
    list[str] | None,
    typer.Argument(
        help="A taint: any text up to 1 KiB without control characters or outer spaces, "
        "e.g. capacity/fast or pool=batch.",
        metavar="TAINT",
        autocompletion=shells.taint_args,
        show_default=False,
    ),
]
KeyOption = Annotated[
    list[str] | None,
    typer.Option(
        "--key",
        help="Also remove every taint whose key (the part before its first '=') is KEY "
        "(repeatable).",
        metavar="KEY",
        autocompletion=shells.taint_keys,
    ),
]


def _change(
    ctx: typer.Context,
    action: UpdateAction,
    chosen: Target,
    taints: list[str],
    *,
    keys: list[str] | None = None,
    dry_run: bool = False,
    yes: bool = False,
) -> None:
    if action in ("add", "remove") and not (taints or keys):
        what = "TAINT or --key KEY" if action == "remove" else "TAINT"
        raise UsageError(f"give at least one {what}")
    check_all(chosen, dry_run, yes)
    from dynamoctl import updates

    updates.run(ctx, action, chosen, taints, keys=keys or (), dry_run=dry_run, yes=yes)


def _split(
    worker: str | None,
    taints: list[str] | None,
    selector: str | None,
    all_workers: bool,
    if_revision: int | None,
) -> tuple[Target, list[str]]:
    """With -l or --all there is no ID: the first argument is a taint too."""
    if (selector is not None or all_workers) and worker is not None:
        return target(None, selector, all_workers, if_revision), [worker, *(taints or [])]
    return target(worker, selector, all_workers, if_revision), list(taints or [])


@app.command("set")
def set_(
    ctx: typer.Context,
    worker: WorkerArg = None,
    taints: TaintArgs = None,
    selector: SelectorOption = None,
    all_workers: AllWorkers = False,
    if_revision: IfRevision = None,
    dry_run: DryRun = False,
    yes: Yes = False,
) -> None:
    """Replace the taints of workers.

    The caller-managed taints become exactly TAINT... (none given: cleared); the
    dynamo.topology/ taints stay."""
    chosen, named = _split(worker, taints, selector, all_workers, if_revision)
    _change(ctx, "replace", chosen, named, dry_run=dry_run, yes=yes)


@app.command()
def add(
    ctx: typer.Context,
    worker: WorkerArg = None,
    taints: TaintArgs = None,
    selector: SelectorOption = None,
    all_workers: AllWorkers = False,
    if_revision: IfRevision = None,
    dry_run: DryRun = False,
    yes: Yes = False,
) -> None:
    """Add taints to workers.

    Taints already held stay as they are."""
    chosen, named = _split(worker, taints, selector, all_workers, if_revision)
    _change(ctx, "add", chosen, named, dry_run=dry_run, yes=yes)


@app.command()
def rm(
    ctx: typer.Context,
    worker: WorkerArg = None,
    taints: TaintArgs = None,
    keys: KeyOption = None,
    selector: SelectorOption = None,
    all_workers: AllWorkers = False,
    if_revision: IfRevision = None,
    dry_run: DryRun = False,
    yes: Yes = False,
) -> None:
    """Remove taints from workers.

    Exactly TAINT..., and with --key every taint of that key (the part before '='). A pool
    taint that a running pool policy owns on the worker is put back by the pool leader
    within moments: the answer says which policy (pause it first to keep it off)."""
    chosen, named = _split(worker, taints, selector, all_workers, if_revision)
    _change(ctx, "remove", chosen, named, keys=keys, dry_run=dry_run, yes=yes)


@app.command()
def clear(
    ctx: typer.Context,
    worker: WorkerArg = None,
    selector: SelectorOption = None,
    all_workers: AllWorkers = False,
    if_revision: IfRevision = None,
    dry_run: DryRun = False,
    yes: Yes = False,
) -> None:
    """Remove every taint of workers.

    Every caller-managed taint; the dynamo.topology/ taints stay."""
    chosen = target(worker, selector, all_workers, if_revision)
    _change(ctx, "clear", chosen, [], dry_run=dry_run, yes=yes)
