"""``dynamoctl status``: the daemon's version, store health, workers, uptime, replica."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from dynamoctl import exits, formats

if TYPE_CHECKING:
    from dynamoctl.output import Printer
    from dynamod.client import AsyncClient
    from dynamod.reports import StatusInfo

STATUS_FORMATS = ("table", "wide", "json", "yaml")


def status(ctx: typer.Context) -> None:
    """Show the daemon's version and health.

    Its version, state, store (and whether it is healthy), worker count, store revision,
    queue depth, uptime and replica name."""
    from dynamoctl.session import execute
    from dynamod import __version__

    async def body(client: AsyncClient, printer: Printer) -> int:
        info = await client.status()
        if printer.output in ("json", "yaml"):
            obj = formats.status_object(info, client.endpoint, __version__)
            obj["open_files"] = {"open": info.open_files, "limit": info.open_files_limit}
            printer.json(obj) if printer.output == "json" else printer.yaml(obj)
        else:
            pairs = formats.status_details(info, client.endpoint, __version__)
            pairs.append(("Open files", open_files(info)))
            for line in formats.details_lines(pairs):
                printer.line(line)
        return exits.OK

    execute(ctx, body, formats=STATUS_FORMATS)


def open_files(info: StatusInfo) -> str:
    """``123 of 65536``: the daemon's open files against its soft limit."""
    if info.open_files_limit <= 0:
        return "unknown (the daemon does not say)"
    count = str(info.open_files) if info.open_files >= 0 else "?"
    return f"{count} of {info.open_files_limit}"
