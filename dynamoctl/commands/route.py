"""``dynamoctl route explain``: how the router would place a request, and why."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from dynamoctl import exits, formats, shells

if TYPE_CHECKING:
    from dynamoctl.output import Printer
    from dynamod.client import AsyncClient
    from dynamod.reports import ExplainInfo

app = typer.Typer(no_args_is_help=True, help="Explain routing decisions.")

EXPLAIN_FORMATS = ("table", "wide", "json", "yaml")


def parse_preferences(pairs: list[str]) -> dict[str, float]:
    """``["pool=batch=0.5", "capacity/fast=1"]`` → taint → weight. The weight follows the
    last '=', so taints with values work. Malformed pairs are usage errors."""
    out: dict[str, float] = {}
    for pair in pairs:
        taint, sep, weight = pair.rpartition("=")
        try:
            value = float(weight)
        except ValueError:
            value = None
        if not sep or not taint or value is None:
            raise typer.BadParameter(
                f"{pair!r} must look like TAINT=WEIGHT, e.g. capacity/fast=0.5 or pool=batch=-1",
                param_hint="--prefer",
            )
        out[taint] = value
    return out


@app.command()
def explain(
    ctx: typer.Context,
    model: Annotated[
        str,
        typer.Option(
            help="The model the request asks for.",
            metavar="MODEL",
            autocompletion=shells.models,
        ),
    ],
    require: Annotated[
        list[str] | None,
        typer.Option(
            help="A taint the worker must hold (repeatable).",
            metavar="TAINT",
            autocompletion=shells.fleet_taints,
        ),
    ] = None,
    prefer: Annotated[
        list[str] | None,
        typer.Option(
            help="A preferred taint and its weight in [-1, 1]; on an NVIDIA Dynamo fleet any "
            "finite 32-bit float, as Dynamo takes (repeatable).",
            metavar="TAINT=WEIGHT",
        ),
    ] = None,
    prompt: Annotated[
        str, typer.Option(help="Prompt text, to show prefix-cache overlap.", metavar="TEXT")
    ] = "",
) -> None:
    """Show how a request would be routed.

    Ranks the workers of MODEL for a request with these constraints, with each term of
    the cost: (LOAD - OVERLAP credit) x MULTIPLIER, where the multiplier is
    exp(-tanh(PREFERENCE)), the sum of the matched preferred weights. OVERLAP names the
    prompt's cached blocks on each worker and where the router learnt them: kv (the
    engine's own KV cache events) or approximate (what this router routed there).
    Excluded workers are listed with the reason. Nothing is routed."""
    from dynamoctl.session import execute

    preferred = parse_preferences(prefer or [])
    required = list(require or [])

    async def body(client: AsyncClient, printer: Printer) -> int:
        from dynamod.taints import DYNAMO_MAX_WEIGHT, RoutingConstraints

        # The daemon's checks, first; the weights' range is its fleet's (Dynamo's is wider).
        RoutingConstraints(frozenset(required), preferred, DYNAMO_MAX_WEIGHT)
        info = await client.explain(model, required=required, preferred=preferred, prompt=prompt)
        if printer.output in ("table", "wide"):
            printer.id_prefix = await client.id_prefix()
        _show(printer, info)
        if any(c.eligible for c in info.candidates):
            return exits.OK
        printer.error(f"no worker of model {model!r} is eligible for this request")
        return exits.FAILED

    execute(ctx, body, formats=EXPLAIN_FORMATS)


def _show(printer: Printer, info: ExplainInfo) -> None:
    if printer.output == "json":
        printer.json(formats.explain_object(info))
    elif printer.output == "yaml":
        printer.yaml(formats.explain_object(info))
    else:
        rows = formats.explain_rows(info, printer.id_prefix)
        if rows:
            printer.table(formats.EXPLAIN_HEADERS, rows)
        if not printer.no_headers:
            printer.line(("\n" if rows else "") + info.summary)
