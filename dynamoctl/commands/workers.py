"""``dynamoctl workers ls|get|cordon|uncordon|drain``: what discovery sees, and taking workers
out of rotation with the ``dynamo.io/cordoned`` taint (a drain adds ``dynamo.io/draining``
and waits: ``dynamoctl/drains.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from dynamoctl import exits, formats, shells
from dynamoctl.targets import AllWorkers, DryRun, SelectorOption, Yes, check_all, target

if TYPE_CHECKING:
    from dynamoctl.output import Printer
    from dynamod.client import AsyncClient
    from dynamod.results import UpdateOutcome
    from dynamod.taints import UpdateAction

app = typer.Typer(
    no_args_is_help=True, help="List and inspect workers; cordon, drain and uncordon."
)

Model = Annotated[
    str | None,
    typer.Option(help="Only workers of this model.", metavar="MODEL", autocompletion=shells.models),
]
WatchOption = Annotated[
    bool,
    typer.Option(
        "--watch", "-w", help="After the list, print every change as it happens (EVENT column)."
    ),
]
OptionalId = Annotated[
    str | None,
    typer.Argument(
        help="Worker id, or any unique prefix of it.",
        metavar="ID",
        autocompletion=shells.worker_ids,
        show_default=False,
    ),
]


def _sort_path(value: str | None) -> str | None:
    if value is not None:
        from dynamoctl.jsonpath import TemplateError, parse_path

        try:
            parse_path(value)
        except TemplateError as exc:
            raise typer.BadParameter(str(exc)) from None
    return value


SortBy = Annotated[
    str | None,
    typer.Option(
        "--sort-by",
        help="Sort by the value at this JSONPath in each worker's -o json object, as "
        "kubectl does (e.g. .state, '{.load.active_requests}', .taints[0]).",
        metavar="JSONPATH",
        callback=_sort_path,
    ),
]


@app.command("ls")
def ls(
    ctx: typer.Context,
    selector: SelectorOption = None,
    model: Model = None,
    watch: WatchOption = False,
    sort_by: SortBy = None,
) -> None:
    """List workers with their taints.

    Columns: ID (the shortest unique prefix, at least 8 characters), MODEL, ADDRESS,
    TAINTS, STATE (ready, cordoned, draining, drained, unhealthy or excluded: left out of
    routing for reading requests otherwise than its model's other workers, -o wide says
    how; on an NVIDIA Dynamo fleet unreachable, or ready,cordon-not-honoured), LOAD
    (requests this dynamod has in flight on it, and what its engine reports), AGE; -o wide
    adds TOPOLOGY, REVISION and MDCSUM. Sorted by model, then id (--sort-by: by any field
    of -o json). dynamod sends a large fleet in pages of 500 from one snapshot, and each
    page is printed as it arrives (with --sort-by, once all have). --watch then prints each
    change as it happens, with an EVENT column (ADDED, TAINTS, REMOVED), like kubectl get
    -w, across dynamod's restarts (said on stderr)."""
    from dynamoctl import listing
    from dynamoctl.session import execute

    execute(ctx, listing.command(selector, model, watch, sort_by), stream=watch)


def _structured(printer: Printer, obj: object) -> None:
    if printer.output == "json":
        printer.json(obj)
    else:
        printer.yaml(obj)


@app.command()
def get(
    ctx: typer.Context,
    worker: Annotated[
        str,
        typer.Argument(
            help="Worker id, or any unique prefix of it.",
            metavar="ID",
            autocompletion=shells.worker_ids,
        ),
    ],
) -> None:
    """Show one worker in full.

    Its record, taints, topology, revision, load and model card."""
    from dynamoctl.session import execute

    async def body(client: AsyncClient, printer: Printer) -> int:
        info = await client.get_worker(worker)
        if printer.output in ("json", "yaml"):
            _structured(printer, formats.worker_object(info))
        elif printer.output == "name":
            printer.line(info.id)
        else:
            for line in formats.details_lines(formats.worker_details(info)):
                printer.line(line)
        if info.warning:
            printer.note(f"warning: {info.warning}")
        return exits.OK

    execute(ctx, body)


def _cordon(
    ctx: typer.Context,
    action: UpdateAction,
    worker: str | None,
    selector: str | None,
    all_workers: bool,
    dry_run: bool,
    yes: bool,
) -> None:
    from dynamoctl import updates
    from dynamod.taints import CORDONED, DRAIN_TAINTS, DRAINING

    chosen = target(worker, selector, all_workers)
    check_all(chosen, dry_run, yes)
    done, already = (
        ("cordoned", "already cordoned") if action == "add" else ("uncordoned", "not cordoned")
    )

    def describe(change: UpdateOutcome) -> str:
        if not change.changed:
            return already
        ended = " (drain ended)" if DRAINING in change.removed else ""
        return (f"would be {done}" if dry_run else done) + ended

    # uncordon also lifts the drain: it ends one
    taints = (CORDONED,) if action == "add" else DRAIN_TAINTS
    updates.run(ctx, action, chosen, taints, dry_run=dry_run, yes=yes, describe=describe)


@app.command()
def cordon(
    ctx: typer.Context,
    worker: OptionalId = None,
    selector: SelectorOption = None,
    all_workers: AllWorkers = False,
    dry_run: DryRun = False,
    yes: Yes = False,
) -> None:
    """Take workers out of routing.

    Adds the dynamo.io/cordoned taint: requests in flight finish, new ones go to other
    workers (unless a request requires that taint)."""
    _cordon(ctx, "add", worker, selector, all_workers, dry_run, yes)


@app.command()
def uncordon(
    ctx: typer.Context,
    worker: OptionalId = None,
    selector: SelectorOption = None,
    all_workers: AllWorkers = False,
    dry_run: DryRun = False,
    yes: Yes = False,
) -> None:
    """Put workers back into routing.

    Removes the dynamo.io/cordoned taint, and dynamo.io/draining: it ends a drain."""
    _cordon(ctx, "remove", worker, selector, all_workers, dry_run, yes)


DrainTimeout = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        help="Wait at most S seconds for the drain, then list what is still in flight and "
        "exit 1 (the workers stay cordoned). Default: wait until drained.",
        metavar="S",
        show_default=False,
    ),
]


AllowGone = Annotated[
    bool,
    typer.Option(
        "--allow-gone",
        help="Exit 0 when a worker is gone mid-drain (killed, or left the fleet) and every "
        "other one drained. Without it a gone worker is reported with what was in flight "
        "and the exit is 1.",
    ),
]


@app.command()
def drain(
    ctx: typer.Context,
    worker: OptionalId = None,
    selector: SelectorOption = None,
    all_workers: AllWorkers = False,
    timeout: DrainTimeout = None,
    dry_run: DryRun = False,
    yes: Yes = False,
    allow_gone: AllowGone = False,
) -> None:
    """Take workers out of routing and wait until nothing is in flight on them.

    Cordons them for a drain (adds dynamo.io/cordoned and dynamo.io/draining in one update):
    new requests go to other workers. Then waits until neither this dynamod's router nor
    the worker's engine (where it reports) has a request in flight, showing each change on
    a terminal, and prints drained (exit 0). When --timeout passes first, or an uncordon
    ends the drain, prints one line per worker not drained with what is in flight there
    (exit 1). A worker killed or gone from the fleet mid-drain is reported gone, with what
    was in flight when it was last seen (it may have been cut): exit 1 unless --allow-gone.
    workers ls shows STATE draining, then drained: the worker can be stopped.
    Ctrl-C ends the wait, not the drain; uncordon ends the drain."""
    from dynamoctl import drains
    from dynamoctl.options import UsageError

    if timeout is not None and not timeout > 0:
        raise UsageError(f"--timeout must be a number of seconds above 0, got {timeout:g}")
    chosen = target(worker, selector, all_workers)
    check_all(chosen, dry_run, yes)
    drains.run(ctx, chosen, timeout, dry_run, yes, allow_gone=allow_gone)
