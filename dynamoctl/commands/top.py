"""``dynamoctl top``: the fleet at a glance, live (``top_live.py``) or one frame
(``--once``, any stdout that is no terminal, ``-o json|yaml``)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from dynamoctl import exits, top_frames
from dynamoctl.options import UsageError, from_context
from dynamoctl.targets import SelectorOption

if TYPE_CHECKING:
    from dynamoctl.output import Printer
    from dynamod.client import AsyncClient
    from dynamod.stats_results import FleetStats, StatsQuery

TOP_FORMATS = ("table", "json", "yaml")

Sort = Annotated[
    str,
    typer.Option(
        "--sort",
        "-s",
        help=f"Order the rows by one of: {', '.join(top_frames.ORDERS)}.",
        metavar="ORDER",
    ),
]
Reverse = Annotated[bool, typer.Option("--reverse", "-r", help="Turn the order round.")]
Once = Annotated[
    bool,
    typer.Option(
        "--once", "-1", help="Print one frame as a table and exit (as when stdout is no terminal)."
    ),
]
LimitOption = Annotated[
    int,
    typer.Option(
        "--limit", "-n", help="One frame: at most N rows (0: every worker).", metavar="N", min=0
    ),
]


def top(
    ctx: typer.Context,
    selector: SelectorOption = None,
    sort: Sort = "load",
    reverse: Reverse = False,
    once: Once = False,
    limit: LimitOption = 0,
) -> None:
    """Show the fleet live: workers, their state, load and latency, hottest first.

    The header: the workers by STATE; answers per second and first-byte p50/p99 through
    this dynamod over the last second; requests waiting in its router; each pool's actual
    and target count, and who leads the pools; the store revision its view has reached.
    One row per worker: ID, MODEL, STATE, POOLS, TAINTS, INFLIGHT (this dynamod's
    requests there), RUN, WAIT and KV (what its engine reports), RPS and P50 (its answers
    per second and their median time to first byte, through this dynamod), MARK (why the
    worker boundary marked it). Sorted by load (the most in flight by any count, then KV
    use, then answers per second). Updated every second from dynamod's stats stream; it
    sends only the rows that fit the screen.

    Keys: q quit (or Ctrl-C), / filter with a selector, space pause, < and > sort by
    another column, r reverse, arrows and PgUp/PgDn scroll. --once, or a stdout that is
    no terminal, prints one frame as a table (like top -b -n 1); -o json or -o yaml one
    frame as an object."""
    from dynamoctl.session import execute

    output = from_context(ctx).output
    live = not once and output == "table" and sys.stdout.isatty()
    if sort not in top_frames.ORDERS:
        raise UsageError(f"--sort {sort!r} is not one of {', '.join(top_frames.ORDERS)}")

    async def body(client: AsyncClient, printer: Printer) -> int:
        from dynamoctl.selection import check_selector
        from dynamod.stats_results import StatsQuery

        check_selector(selector)
        query = StatsQuery(selector or "", sort, reverse, limit)
        if live:
            return await _live(client, printer, query)
        return await _once(client, printer, query)

    execute(ctx, body, formats=TOP_FORMATS, stream=live)


async def _live(client: AsyncClient, printer: Printer, query: StatsQuery) -> int:
    from dynamoctl.output import Screen
    from dynamoctl.terminal import KeyReader
    from dynamoctl.top_live import LiveTop

    with KeyReader().reading() as keys, Screen(printer.stdout) as screen:
        return await LiveTop(client, screen, query).run(keys)


async def _once(client: AsyncClient, printer: Printer, query: StatsQuery) -> int:
    """The first frame whose rates cover an interval (the second one, when the daemon was
    not sampling yet: about a second)."""
    frame = None
    async for frame in client.watch_stats(query):
        if frame.interval:
            break
    if frame is None:
        printer.error("dynamod ended the stats stream before its first frame (it is draining)")
        return exits.FAILED
    show(printer, frame, query.selector)
    return exits.OK


def show(printer: Printer, frame: FleetStats, selector: str = "") -> None:
    """One frame: its object (-o json, -o yaml) or its header lines and table."""
    if printer.output == "json":
        printer.json(top_frames.frame_object(frame))
        return
    if printer.output == "yaml":
        printer.yaml(top_frames.frame_object(frame))
        return
    if not printer.no_headers:
        for line in top_frames.header_lines(frame, selector):
            printer.line(line)
        printer.line()
    printer.table(top_frames.HEADERS, top_frames.rows(frame))
