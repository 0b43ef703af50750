"""``dynamoctl pools apply|ls|get|status|pause|resume|rm``: pool policies, the shares of
pool taints dynamod keeps true over a set of workers as the fleet changes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dynamoctl import exits, pool_formats
from dynamoctl.formats import details_lines

if TYPE_CHECKING:
    from dynamoctl.output import Printer
    from dynamod.client import AsyncClient

app = typer.Typer(
    no_args_is_help=True,
    help="Pool policies: shares of pool taints dynamod keeps true over a set of workers.",
)

STATUS_FORMATS = ("table", "wide", "json", "yaml")
PolicyName = Annotated[str, typer.Argument(help="The policy's name.", metavar="NAME")]


def _structured(printer: Printer, obj: object) -> None:
    if printer.output == "json":
        printer.json(obj)
    else:
        printer.yaml(obj)


def _read(path: Path) -> str:
    from dynamoctl.options import UsageError

    if str(path) == "-":
        return sys.stdin.read()
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read policy file {str(path)!r}: {exc}") from None


@app.command()
def apply(
    ctx: typer.Context,
    file: Annotated[
        Path,
        typer.Option(
            "--filename",
            "-f",
            help="The policy document, YAML or JSON ('-': stdin).",
            metavar="FILE",
        ),
    ],
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Check the policy and print each move it would make; store nothing."
        ),
    ] = False,
) -> None:
    """Create or change a policy from a file.

    A refused policy stores nothing; the error names the field and the rule. Applying the
    same document again changes nothing. Prints what happened and each move the daemon
    plans (WORKER, FROM, TO, WHY); the leader makes them at once, or as its move budget
    allows. See POOLS in dynamoctl(1) for the document's keys."""
    from dynamoctl.session import execute

    document = _read(file)

    async def body(client: AsyncClient, printer: Printer) -> int:
        outcome = await client.apply_policy(document, dry_run=dry_run)
        if printer.output in ("json", "yaml"):
            _structured(printer, pool_formats.apply_object(outcome))
        elif printer.output == "name":
            printer.line(outcome.policy.name)
        else:
            printer.line(pool_formats.apply_summary(outcome))
            if outcome.moves:
                rows = pool_formats.move_rows(outcome.moves, await client.id_prefix())
                printer.table(pool_formats.MOVE_HEADERS, rows)
        return exits.OK

    execute(ctx, body)


@app.command("ls")
def ls(ctx: typer.Context) -> None:
    """List the policies.

    Columns: NAME, SELECTOR, POOLS (taint:weight), PAUSED, REVISION; -o wide adds OPTIONS
    (min_per_pool, max_moves, move_interval, spread_by, elastic) and RETIRED."""
    from dynamoctl.session import execute

    async def body(client: AsyncClient, printer: Printer) -> int:
        policies = await client.list_policies()
        if printer.output in ("json", "yaml"):
            _structured(printer, [pool_formats.policy_object(p) for p in policies])
        elif printer.output == "name":
            for policy in policies:
                printer.line(policy.name)
        else:
            headers = (
                pool_formats.POLICY_WIDE_HEADERS if printer.wide else pool_formats.POLICY_HEADERS
            )
            printer.table(headers, [pool_formats.policy_row(p, printer.wide) for p in policies])
        return exits.OK

    execute(ctx, body)


@app.command()
def get(ctx: typer.Context, name: PolicyName) -> None:
    """Show one policy as stored.

    -o yaml prints it with its document under 'policy', which pools apply -f takes back."""
    from dynamoctl.session import execute

    async def body(client: AsyncClient, printer: Printer) -> int:
        info = await client.get_policy(name)
        if printer.output in ("json", "yaml"):
            _structured(printer, pool_formats.policy_object(info))
        elif printer.output == "name":
            printer.line(info.name)
        else:
            for line in details_lines(pool_formats.policy_details(info)):
                printer.line(line)
        return exits.OK

    execute(ctx, body)


@app.command()
def status(ctx: typer.Context, name: PolicyName) -> None:
    """Show what a policy wants and has, and what the leader did.

    The target and actual routable workers per pool (an elastic policy's also its demand,
    requests in flight plus waiting, and the workers that demand wants), the moves still
    pending (and those failing: each worker's error, attempts and next attempt), the recent
    moves the leader made (time, epoch, revision), the drift it saw and what it did, and
    which daemon leads. Counts and pending moves are the answering daemon's plan; recent
    moves and drift come from the leader's history, so any daemon can answer."""
    from dynamoctl.session import execute

    async def body(client: AsyncClient, printer: Printer) -> int:
        info = await client.pool_status(name)
        if printer.output in ("json", "yaml"):
            _structured(printer, pool_formats.status_object(info))
            return exits.OK
        for line in details_lines(pool_formats.status_details(info)):
            printer.line(line)
        counts = pool_formats.count_rows(info)
        _section(printer, "Pools", pool_formats.count_headers(info), counts)
        prefix = await client.id_prefix()
        moves = pool_formats.move_rows(info.pending, prefix)
        _section(printer, "Pending moves", pool_formats.MOVE_HEADERS, moves)
        failing = pool_formats.failing_rows(info.failing)
        _section(printer, "Failing moves", pool_formats.FAILING_HEADERS, failing)
        made = pool_formats.made_rows(info.recent if printer.wide else info.recent[-10:], prefix)
        _section(printer, "Recent moves", pool_formats.MADE_HEADERS, made)
        drift = pool_formats.drift_rows(info.drift if printer.wide else info.drift[-10:], prefix)
        _section(printer, "Drift", pool_formats.DRIFT_HEADERS, drift)
        return exits.OK

    execute(ctx, body, formats=STATUS_FORMATS)


def _section(printer: Printer, title: str, headers: Any, rows: list[list[str]]) -> None:
    printer.line()
    if not rows:
        printer.line(f"{title}: none")
        return
    printer.line(f"{title}:")
    printer.table(headers, rows)


def _pause(ctx: typer.Context, name: str, paused: bool) -> None:
    from dynamoctl.session import execute

    async def body(client: AsyncClient, printer: Printer) -> int:
        call = client.pause_policy if paused else client.resume_policy
        info, changed = await call(name)
        if printer.output in ("json", "yaml"):
            _structured(printer, {**pool_formats.policy_object(info), "changed": changed})
        elif printer.output == "name":
            printer.line(info.name)
        else:
            state = "paused" if paused else "resumed"
            printer.line(f"policy {name} {state}" if changed else f"policy {name} already {state}")
        return exits.OK

    execute(ctx, body)


@app.command()
def pause(ctx: typer.Context, name: PolicyName) -> None:
    """Stop a policy's writes: it is still planned and its drift reported, nothing is
    moved or put back until it is resumed."""
    _pause(ctx, name, True)


@app.command()
def resume(ctx: typer.Context, name: PolicyName) -> None:
    """Let a paused policy write again: pending moves are made, drift is put back."""
    _pause(ctx, name, False)


@app.command("rm")
def rm(ctx: typer.Context, name: PolicyName) -> None:
    """Remove a policy. Every worker keeps its taints as they are (says how many still hold
    one of its pool taints); remove them with taints rm if you want them gone."""
    from dynamoctl.session import execute

    async def body(client: AsyncClient, printer: Printer) -> int:
        outcome = await client.remove_policy(name)
        if printer.output in ("json", "yaml"):
            _structured(printer, pool_formats.remove_object(outcome))
        elif printer.output == "name":
            printer.line(outcome.policy.name)
        else:
            printer.line(pool_formats.remove_summary(outcome))
        return exits.OK

    execute(ctx, body)
