"""``workers drain``: cordon for a drain, then wait until nothing is in flight.

The cordon is a taint update like any other (``updates.apply``: one worker, or a selector
with its dry run, question and progress bar), adding ``dynamo.io/cordoned`` and
``dynamo.io/draining`` together. Then the daemon's drain wait (``AsyncClient.follow_drain``):
it sends each worker's in-flight figures as they change, shown as they come on a terminal
(stderr), until every worker is drained (``drained``, exit 0), the timeout passes or a
drain is ended by an uncordon (one line per worker not drained, saying what is still in
flight there, exit 1), or a worker is gone mid-drain (killed or left: reported ``gone`` with
what was in flight when last seen, exit 1 unless ``--allow-gone``). Ctrl-C ends the wait,
not the drain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dynamoctl import exits, formats, updates
from dynamoctl.output import Printer

if TYPE_CHECKING:
    import typer

    from dynamod.client import AsyncClient
    from dynamod.reports import DrainEvent, DrainResult, DrainStatus
    from dynamod.results import UpdateOutcome
    from dynamod.targets import Target


def run(
    ctx: typer.Context,
    target: Target,
    timeout: float | None,
    dry_run: bool,
    yes: bool,
    *,
    allow_gone: bool = False,
) -> None:
    """The whole command: check, cordon, wait, show."""
    from dynamoctl.selection import check_selector
    from dynamoctl.session import execute

    async def body(client: AsyncClient, printer: Printer) -> int:
        check_selector(target.selector)
        return await drain(
            client, printer, target, timeout, dry_run=dry_run,
            confirm=target.all and not yes, allow_gone=allow_gone,
        )  # fmt: skip

    execute(ctx, body)


async def drain(
    client: AsyncClient,
    printer: Printer,
    target: Target,
    timeout: float | None,  # noqa: ASYNC109 - the daemon's wait, which reports at its end
    *,
    dry_run: bool = False,
    confirm: bool = False,
    allow_gone: bool = False,
) -> int:
    from dynamod.taints import DRAIN_TAINTS, TaintUpdate

    update = TaintUpdate.add(DRAIN_TAINTS)
    cordoned = await updates.apply(
        client, printer, update, target, dry_run=dry_run, confirm=confirm
    )
    if cordoned:
        printer.id_prefix = await client.id_prefix()
    if dry_run or not cordoned:
        return updates.show(printer, cordoned, target, dry_run=dry_run, describe=_describe)
    shorts = formats.short_ids((c.worker for c in cordoned), printer.id_prefix)
    for change in cordoned:
        if change.error is not None:
            printer.error(updates.failure_line(change, shorts[change.worker]))
    live = _Progress(printer, shorts) if printer.stderr.isatty() else None
    result = await client.follow_drain(cordoned, target, timeout=timeout, progress=live)
    return show(printer, result, timeout, allow_gone=allow_gone)


def _describe(change: UpdateOutcome) -> str:
    return "would be drained" if change.changed else "already draining"


class _Progress:
    """On a terminal: a line on stderr each time a worker's figures change."""

    def __init__(self, printer: Printer, shorts: dict[str, str]) -> None:
        self.printer = printer
        self.shorts = shorts

    def __call__(self, event: DrainEvent) -> None:
        if event.last:
            return  # the result says it
        for status in event.workers:
            self.printer.note(f"{self._short(status)} {status.describe()}")

    def _short(self, status: DrainStatus) -> str:
        return self.shorts.get(status.worker, status.worker[: self.printer.id_prefix])


def show(
    printer: Printer, result: DrainResult, timeout: float | None, *, allow_gone: bool = False
) -> int:
    """Print the result in the chosen format; 0 when every worker drained (or, with
    ``allow_gone``, every other one was gone), else 1 with one line per worker not drained
    (and a line on stderr saying why the wait ended)."""
    if printer.output in ("json", "yaml"):
        obj = result_object(result)
        printer.json(obj) if printer.output == "json" else printer.yaml(obj)
    elif printer.output == "name":
        for status in result.workers:
            if status.drained:
                printer.line(status.worker)
    elif result.drained:
        printer.line("drained")
    else:
        shorts = formats.short_ids((w.worker for w in result.workers), printer.id_prefix)
        for status in result.busy:
            printer.line(f"{shorts[status.worker]}   {status.describe()}")
    if result.drained:
        return exits.OK
    printer.error(_why(result, timeout))
    return exits.OK if allow_gone and _only_gone(result) else exits.FAILED


def _only_gone(result: DrainResult) -> bool:
    """Every worker not drained is gone, every cordon held, and the wait was not cut."""
    failed = any(c.error is not None for c in result.cordoned)
    return bool(result.busy) and all(s.gone for s in result.busy) and not failed


def _why(result: DrainResult, timeout: float | None) -> str:
    busy = len(result.busy)
    count = f"{busy} of {len(result.workers)} worker{'s' if len(result.workers) != 1 else ''}"
    gone = sum(s.gone for s in result.busy)
    if gone and not result.timed_out:
        were = "was" if gone == 1 else "were"
        return (
            f"{gone} of {len(result.workers)} worker{'s' if len(result.workers) != 1 else ''} "
            f"{were} gone mid-drain (killed, or left the fleet): what was in flight there may "
            "have been cut (--allow-gone accepts this)"
        )
    if result.timed_out:
        return f"{count} not drained within the timeout of {timeout or 0:g} s"
    if busy:
        return f"{count} not drained: their drain was ended (uncordoned)"
    return "not every worker was cordoned for the drain (see the errors above)"


def result_object(result: DrainResult) -> dict[str, Any]:
    return {
        "drained": result.drained,
        "timed_out": result.timed_out,
        "workers": [status_object(s) for s in result.workers],
        "failed": [
            {"id": c.worker, "code": c.error.code, "message": c.error.message}
            for c in result.cordoned
            if c.error is not None
        ],
    }


def status_object(status: DrainStatus) -> dict[str, Any]:
    flight = status.in_flight
    return {
        "id": status.worker,
        "key": status.key,
        "state": str(status.state),
        "drained": status.drained,
        "draining": status.draining,
        "gone": status.gone,
        "in_flight": {
            "requests": flight.requests,
            "engine": None
            if flight.running is None
            else {"running": flight.running, "waiting": flight.waiting},
        },
    }
