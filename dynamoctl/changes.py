"""Changing taints on one worker or many, and saying what changed.

One worker: one call, with ``--if-revision`` as its compare-and-swap guard; its error is
the command's error. Many workers (``-l`` / ``--all``): a dry-run call first (it names the
workers and what would change, and feeds the ``--all`` question), then one call per worker,
16 at a time, with a progress bar on a terminal. Each of those is the daemon's
compare-and-swap on the freshly read taints, so nothing another writer did meanwhile is
lost. A worker that fails is reported on its own; an unreachable daemon or a refused
token ends the whole operation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from dynamoctl import exits, views
from dynamoctl.output import Printer
from dynamoctl.targets import Target
from dynamod.errors import DynamoError, InvalidInputError, UnauthenticatedError, UnreachableError

if TYPE_CHECKING:
    import typer

    from dynamod.api.client import Client
    from dynamod.api.types import TaintChange
    from dynamod.discovery.registry import OpKind

CONCURRENCY = 16


@dataclass(frozen=True)
class Request:
    """One taint operation as the API takes it; ``check()`` validates it the daemon's way."""

    kind: OpKind  # replace, add, remove or clear
    taints: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()

    def check(self) -> None:
        """Refuse what the daemon would refuse, with its exact message (``TaintError``):
        the very validation the daemon runs, before anything is sent."""
        from dynamod.discovery.registry import TaintOp

        TaintOp(self.kind, self.taints, self.keys)


async def apply(
    client: Client,
    printer: Printer,
    request: Request,
    target: Target,
    *,
    expect_revision: int | None = None,
    dry_run: bool = False,
    confirm: bool = False,
) -> list[TaintChange]:
    """Run ``request`` on ``target``; ``confirm``: ask before changing (``--all``)."""
    if not target.bulk:
        return await _call(client, request, target, dry_run=dry_run, expect=expect_revision)
    plan = await _call(client, request, target, dry_run=True)
    if dry_run or not any(c.changed for c in plan):
        return plan
    if confirm and not await printer.confirm(_question(plan)):
        raise InvalidInputError("nothing was changed: the answer was not yes")
    return await _fan_out(client, printer, request, plan)


async def _call(
    client: Client,
    request: Request,
    target: Target,
    *,
    dry_run: bool = False,
    expect: int | None = None,
) -> list[TaintChange]:
    return await client.update_taints(
        request.kind,
        request.taints,
        keys=request.keys,
        worker=target.worker,
        selector=target.selector,
        all_workers=target.all,
        expect_revision=expect,
        dry_run=dry_run,
    )


def _question(plan: Sequence[TaintChange]) -> str:
    changing = [c for c in plan if c.changed]
    sample = views.change_text(changing[0].added, changing[0].removed)
    return f"Change taints of {len(changing)} of all {len(plan)} workers (e.g. {sample})?"


async def _fan_out(
    client: Client, printer: Printer, request: Request, plan: Sequence[TaintChange]
) -> list[TaintChange]:
    gate = asyncio.Semaphore(CONCURRENCY)
    results: dict[str, TaintChange] = {}
    fatal: list[DynamoError] = []
    todo = [c for c in plan if c.error is None]
    with printer.progress(len(todo), "updating taints") as advance:
        async with asyncio.TaskGroup() as group:
            for planned in todo:
                group.create_task(_one(client, request, planned, gate, results, fatal, advance))
    if fatal:
        raise fatal[0]
    return [results.get(c.key, c) for c in plan]


async def _one(
    client: Client,
    request: Request,
    planned: TaintChange,
    gate: asyncio.Semaphore,
    results: dict[str, TaintChange],
    fatal: list[DynamoError],
    advance: Callable[[], None],
) -> None:
    async with gate:
        try:
            (results[planned.key],) = await _call(client, request, Target(planned.key))
        except (UnreachableError, UnauthenticatedError) as exc:
            fatal.append(exc)
        except DynamoError as exc:
            results[planned.key] = failed(planned, exc)
    advance()


def failed(planned: TaintChange, error: DynamoError) -> TaintChange:
    from dynamod.api.types import Failure
    from dynamod.status import code_name

    failure = Failure(code_name(error), str(error))
    return replace(planned, after=planned.before, error=failure)


Describe = Callable[["TaintChange", bool], str]


def describe_change(change: TaintChange, dry_run: bool) -> str:
    return views.change_text(change.added, change.removed)


def run(
    ctx: typer.Context,
    request: Request,
    chosen: Target,
    *,
    if_revision: int | None = None,
    dry_run: bool = False,
    yes: bool = False,
    describe: Describe = describe_change,
) -> None:
    """The whole command: validate, apply, show (``taints *``, ``workers cordon``)."""
    from dynamoctl.session import execute
    from dynamoctl.targets import check_selector

    async def body(client: Client, printer: Printer) -> int:
        request.check()
        check_selector(chosen.selector)
        done = await apply(
            client, printer, request, chosen,
            expect_revision=if_revision, dry_run=dry_run, confirm=chosen.all and not yes,
        )  # fmt: skip
        return show(printer, done, chosen, dry_run=dry_run, describe=describe)

    execute(ctx, body)


def show(
    printer: Printer,
    changes: Sequence[TaintChange],
    target: Target,
    *,
    dry_run: bool = False,
    describe: Describe = describe_change,
) -> int:
    """Print the outcome in the chosen format; each failure gets its own line on stderr.
    Returns 1 when any worker failed."""
    shorts = views.short_ids(c.worker for c in changes)
    for change in changes:
        if change.error is not None:
            printer.error(f"worker {shorts[change.worker]}: {change.error.message}")
    _render(printer, changes, shorts, dry_run, describe)
    if not changes:
        printer.note(f"no worker matched: {target.describe()}")
    elif dry_run:
        printer.note("dry run: nothing was written")
    return exits.FAILED if any(c.error for c in changes) else exits.OK


def _render(
    printer: Printer,
    changes: Sequence[TaintChange],
    shorts: dict[str, str],
    dry_run: bool,
    describe: Describe,
) -> None:
    if printer.output in ("json", "yaml"):
        objects = [views.change_object(c, dry_run) for c in changes]
        printer.json(objects) if printer.output == "json" else printer.yaml(objects)
        return
    done = [c for c in changes if c.error is None]
    if printer.output == "name":
        for change in done:
            printer.line(change.worker)
        return
    if done:
        _table(printer, done, shorts, dry_run or printer.wide, dry_run, describe)


def _table(
    printer: Printer,
    done: Sequence[TaintChange],
    shorts: dict[str, str],
    full: bool,
    dry_run: bool,
    describe: Describe,
) -> None:
    headers = ["WORKER", "CHANGE", "REVISION"] + (["BEFORE", "AFTER"] if full else [])
    rows = []
    for change in done:
        row = [shorts[change.worker], describe(change, dry_run), str(change.revision)]
        if full:
            before, after = views.caller_part(change.before), views.caller_part(change.after)
            row += [views.joined(before), views.joined(after)]
        rows.append(row)
    printer.table(headers, rows, style=_change_style)


def _change_style(column: int, cell: str) -> str | None:
    if column != 1 or cell == "unchanged":
        return None
    return "green" if cell.startswith("+") else ("red" if cell.startswith("-") else None)
