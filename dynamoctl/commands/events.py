"""``dynamoctl events tail``: discovery events as they happen, resumable by revision."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from dynamoctl import exits
from dynamoctl.targets import SelectorOption

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from dynamoctl.output import Printer
    from dynamod.client import AsyncClient
    from dynamod.reports import EventInfo

app = typer.Typer(
    no_args_is_help=True,
    help="Discovery events: workers added, removed, their taints changed; pool events.",
)

STREAM_FORMATS = ("table", "wide", "json", "yaml")


@app.command()
def tail(
    ctx: typer.Context,
    since: Annotated[
        int | None,
        typer.Option(
            help="Start after store revision REV (replayed from the daemon's history; a "
            "RESYNC snapshot first when REV is older than it).",
            metavar="REV",
        ),
    ] = None,
    no_follow: Annotated[
        bool, typer.Option("--no-follow", help="Print what is known now, then exit.")
    ] = False,
    selector: SelectorOption = None,
    pools: Annotated[
        bool,
        typer.Option(
            "--pools/--no-pools",
            help="Include pool events (EVENT POOL): policies applied, changed, paused, "
            "resumed, removed; the leader's moves and the drift it saw; a new leader.",
        ),
    ] = True,
) -> None:
    """Follow discovery events.

    Columns: TIME, REVISION, EVENT (ADDED, TAINTS, REMOVED, RESYNC, POOL), WORKER, CHANGE.
    Starts with a RESYNC snapshot unless --since is given. Pool events come in the order
    dynamod learned them, each with the store revision it reflects (a move: the worker's
    record it wrote); with -l only the moves and drift of matching workers. -o json prints
    one JSON object per line. When dynamod restarts or cannot be reached, it says so on
    stderr and reconnects, resuming after the last revision it printed. Ctrl-C ends it
    (exit status 0)."""
    from dynamoctl.session import execute

    async def body(client: AsyncClient, printer: Printer) -> int:
        from dynamoctl.selection import check_selector
        from dynamoctl.watch import EventTail

        check_selector(selector)
        if printer.output == "table":
            printer.id_prefix = await client.id_prefix()
        from dynamoctl.resume import following

        stream = EventTail(printer, buffered=no_follow)

        def tail(after: int | None) -> AsyncIterator[EventInfo]:
            return client.tail_events(
                since=after, selector=selector or "", follow=not no_follow, pools=pools
            )

        events = tail(since) if no_follow else following(printer, tail, since)
        async for event in events:
            stream.feed(event)
        stream.close()
        return exits.OK

    execute(ctx, body, formats=STREAM_FORMATS, stream=True)
