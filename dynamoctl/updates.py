"""Updating taints on one worker or many, and saying what changed.

One worker: one call, with ``--if-revision`` as its compare-and-swap guard; its error is
the command's error. Many workers (``-l`` / ``--all``): a dry run first (it names the
workers and what would change, and feeds the ``--all`` question), then the daemon's own
bulk update, streamed: each worker's outcome arrives as soon as the daemon has it and
advances the progress bar on a terminal. Each worker's update is the daemon's
compare-and-swap on the freshly read taints, so nothing another writer did meanwhile is
lost. A worker that fails is reported on its own; an unreachable daemon or a refused token
ends the whole operation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from dynamoctl import exits, formats
from dynamoctl.output import Printer
from dynamod.errors import DynamoError, InvalidInputError

if TYPE_CHECKING:
    import typer

    from dynamoctl.session import LightBody
    from dynamod.client import AsyncClient
    from dynamod.client.light import LightClient
    from dynamod.results import UpdateOutcome
    from dynamod.taints import TaintUpdate, UpdateAction
    from dynamod.targets import Target


async def apply(
    client: AsyncClient | LightClient,
    printer: Printer,
    update: TaintUpdate,
    target: Target,
    *,
    dry_run: bool = False,
    confirm: bool = False,
) -> list[UpdateOutcome]:
    """Run ``update`` on ``target``; ``confirm``: ask before changing (``--all``)."""
    if not target.bulk:
        return await client.update_taints(update, target, dry_run=dry_run)
    plan = await client.update_taints(update, target, dry_run=True)
    if dry_run or not any(c.changed for c in plan):
        return plan
    if confirm and not await printer.confirm(_question(plan)):
        raise InvalidInputError("nothing was changed: the answer was not yes")
    return await _bulk(client, printer, update, target, plan)


def _question(plan: Sequence[UpdateOutcome]) -> str:
    changing = [c for c in plan if c.changed]
    sample = formats.change_text(changing[0].added, changing[0].removed)
    return f"Change taints of {len(changing)} of all {len(plan)} workers (e.g. {sample})?"


async def _bulk(
    client: AsyncClient | LightClient,
    printer: Printer,
    update: TaintUpdate,
    target: Target,
    plan: Sequence[UpdateOutcome],
) -> list[UpdateOutcome]:
    """The daemon's bulk update, streamed; the outcomes in the plan's order (a worker that
    matched only after the dry run comes last)."""
    done: dict[str, UpdateOutcome] = {}
    with printer.progress(len(plan), "updating taints") as advance:
        async for change in client.stream_update_taints(update, target):
            done[change.key] = change
            advance()
    ordered = [done.pop(c.key) for c in plan if c.key in done]
    return ordered + sorted(done.values(), key=lambda c: c.key)


Describe = Callable[["UpdateOutcome"], str]


def describe_outcome(change: UpdateOutcome) -> str:
    return formats.change_text(change.added, change.removed)


def run(
    ctx: typer.Context,
    action: UpdateAction,
    target: Target,
    taints: Iterable[str] = (),
    *,
    keys: Iterable[str] = (),
    dry_run: bool = False,
    yes: bool = False,
    describe: Describe = describe_outcome,
) -> None:
    """The whole command: check, apply, show (``taints *``, ``workers cordon``)."""
    from dynamoctl.session import execute

    execute(ctx, command(action, target, taints, keys=keys, dry_run=dry_run, yes=yes,
                         describe=describe))  # fmt: skip


def command(
    action: UpdateAction,
    target: Target,
    taints: Iterable[str] = (),
    *,
    keys: Iterable[str] = (),
    dry_run: bool = False,
    yes: bool = False,
    describe: Describe = describe_outcome,
) -> LightBody:
    """``run``'s session body, which ``direct.py`` runs without typer (and gRPC)."""

    async def body(client: AsyncClient | LightClient, printer: Printer) -> int:
        from dynamoctl.selection import check_selector
        from dynamod.taints import TaintUpdate

        update = TaintUpdate(action, tuple(taints), tuple(keys))  # the taint rules, once
        check_selector(target.selector)
        done = await apply(
            client, printer, update, target, dry_run=dry_run, confirm=target.all and not yes
        )
        if done:
            printer.id_prefix = await client.id_prefix()
        code = show(printer, done, target, dry_run=dry_run, describe=describe)
        if action != "add":
            for hint in await put_back(client, done):
                printer.note(hint)
        return code

    return body


async def put_back(
    client: AsyncClient | LightClient, changes: Sequence[UpdateOutcome]
) -> list[str]:
    """A line for each pool taint removed here that a running pool policy owns on that
    worker: its leader puts it back within moments, so the removal that returned ok would
    not last. Nothing when no taint was removed, or the policies cannot be read (the
    update itself is done and reported)."""
    removed = {(c.worker, t) for c in changes if c.error is None for t in c.removed}
    if not removed:
        return []
    try:
        policies = await client.list_policies()
        hints = []
        for policy in policies:
            taken = sorted((w, t) for w, t in removed if t in policy.pools)
            if policy.paused or not taken:
                continue
            selected, _ = await client.list_workers(selector=policy.selector, fields=["id"])
            owned = {w.id for w in selected}
            hints += [_owned(policy.name, w, t) for w, t in taken if w in owned]
    except DynamoError:  # no pools to read here (or the daemon went): nothing to add
        return []
    return hints


def _owned(policy: str, worker: str, taint: str) -> str:
    return (
        f"policy {policy} owns {formats.shown_taint(taint)} on worker {worker} and will put it "
        f"back; to keep it off, pause the policy first: dynamoctl pools pause {policy}"
    )


def show(
    printer: Printer,
    changes: Sequence[UpdateOutcome],
    target: Target,
    *,
    dry_run: bool = False,
    describe: Describe = describe_outcome,
) -> int:
    """Print the outcome in the chosen format; each failure gets its own line on stderr.
    Returns 1 when any worker failed."""
    shorts = formats.short_ids((c.worker for c in changes), printer.id_prefix)
    for change in changes:
        if change.error is not None:
            printer.error(failure_line(change, shorts[change.worker]))
    _render(printer, changes, shorts, dry_run, describe)
    if not changes:  # a selector that matches nothing is usually a typo
        printer.error(f"no worker matched: {target.describe()}")
        return exits.FAILED
    if dry_run:
        printer.note("dry run: nothing was written")
    return exits.FAILED if any(c.error for c in changes) else exits.OK


def failure_line(change: UpdateOutcome, short: str) -> str:
    """``worker ID: why``, unless the daemon's message already names the worker."""
    assert change.error is not None
    message = change.error.message
    if message.startswith((f"worker {change.worker}", f"worker {short}")):
        return message
    return f"worker {short}: {message}"


def _render(
    printer: Printer,
    changes: Sequence[UpdateOutcome],
    shorts: dict[str, str],
    dry_run: bool,
    describe: Describe,
) -> None:
    if printer.output in ("json", "yaml"):
        objects = [formats.change_object(c, dry_run) for c in changes]
        printer.json(objects) if printer.output == "json" else printer.yaml(objects)
        return
    done = [c for c in changes if c.error is None]
    if printer.output == "name":
        for change in done:
            printer.line(change.worker)
        return
    if done:
        _table(printer, done, shorts, dry_run or printer.wide, describe)


def _table(
    printer: Printer,
    done: Sequence[UpdateOutcome],
    shorts: dict[str, str],
    full: bool,
    describe: Describe,
) -> None:
    headers = ["WORKER", "CHANGE", "REVISION"] + (["BEFORE", "AFTER"] if full else [])
    rows = []
    for change in done:
        row = [shorts[change.worker], describe(change), str(change.revision)]
        if full:
            row += [formats.taints_text(change.before), formats.taints_text(change.after)]
        rows.append(row)
    printer.table(headers, rows, style=_change_style)


def _change_style(column: int, cell: str) -> str | None:
    if column != 1 or cell == "unchanged":
        return None
    return "green" if cell.startswith("+") else ("red" if cell.startswith("-") else None)
