"""How dynamoctl writes: tables, JSON, YAML and names on stdout; diagnostics, prompts and
progress on stderr. The only module that imports rich, and only when a terminal will see
colour or a progress bar: piped output never pays for it.

Tables are plain columns separated by three spaces, like kubectl's, so ``awk`` and
``--no-headers`` work. Colour is used only when the stream is a terminal, ``NO_COLOR`` is
unset and ``TERM`` is not ``dumb``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

GAP = "   "
Style = Callable[[int, str], str | None]  # (column, cell) -> a rich style, or None


def wants_colour(stream: IO[str]) -> bool:
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return stream.isatty()


def widths_of(rows: Sequence[Sequence[str]]) -> list[int]:
    return [max(len(row[i]) for row in rows) for i in range(len(rows[0]))] if rows else []


def format_row(cells: Sequence[str], widths: Sequence[int]) -> str:
    """Cells padded to ``widths``, the last one unpadded (no trailing spaces)."""
    padded = [cell.ljust(width) for cell, width in zip(cells[:-1], widths, strict=False)]
    return GAP.join([*padded, cells[-1]]) if cells else ""


class Printer:
    """One command's output, in the format the user chose."""

    def __init__(
        self,
        output: str = "table",
        *,
        no_headers: bool = False,
        stdout: IO[str] | None = None,
        stderr: IO[str] | None = None,
    ) -> None:
        self.shape: Any = None
        """``-o jsonpath=`` / ``custom-columns=``: a ``jsonpath.Shape``; ``output`` is then
        ``json``, whose objects it reshapes."""
        if output.partition("=")[0] in ("jsonpath", "custom-columns"):
            from dynamoctl.jsonpath import Shape

            self.shape, output = Shape(output, no_headers=no_headers), "json"
        self.output = output
        self.no_headers = no_headers
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.colour = wants_colour(self.stdout)
        self._console: Any = None
        self.id_prefix = 8
        """How many characters of an id its tables show at least: the daemon's prefix that
        tells apart every worker it sees (``AsyncClient.id_prefix``), once asked."""

    @property
    def wide(self) -> bool:
        return self.output == "wide"

    def table(
        self,
        headers: Sequence[str],
        rows: Sequence[Sequence[str]],
        *,
        style: Style | None = None,
        minimum: Sequence[int] = (),
    ) -> list[int]:
        """Print a table; return the column widths (a stream keeps using them)."""
        shown = rows if self.no_headers else [headers, *rows]
        widths = widths_of([headers, *rows])
        if minimum:
            widths = [max(w, m) for w, m in zip(widths, minimum, strict=True)]
        for index, row in enumerate(shown):
            header = index == 0 and not self.no_headers
            self.row(row, widths, style=None if header else style, header=header)
        return widths

    def row(
        self,
        cells: Sequence[str],
        widths: Sequence[int],
        *,
        style: Style | None = None,
        header: bool = False,
    ) -> None:
        if not self.colour:
            self.line(format_row(cells, widths))
            return
        self._styled_row(cells, widths, style, header)

    def _styled_row(
        self, cells: Sequence[str], widths: Sequence[int], style: Style | None, header: bool
    ) -> None:
        from rich.text import Text

        text = Text()
        for index, cell in enumerate(cells):
            last = index == len(cells) - 1
            shown = cell if last else cell.ljust(widths[index])
            chosen = "bold" if header else (style(index, cell) if style else None)
            text.append(shown, style=chosen or "")
            if not last:
                text.append(GAP)
        self._stdout_console().print(text)

    def _stdout_console(self) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(
                file=self.stdout, force_terminal=True, highlight=False, soft_wrap=True
            )
        return self._console

    def line(self, text: str = "") -> None:
        self.stdout.write(text + "\n")

    def json(self, obj: object) -> None:
        if self.shape is not None:
            self.stdout.write(self.shape.text(obj))
            return
        self.line(json.dumps(obj, indent=2, sort_keys=False))

    def json_line(self, obj: object) -> None:
        """One compact JSON object per line, flushed at once (jq-friendly streams)."""
        if self.shape is not None:
            self.stdout.write(self.shape.streamed(obj))
        else:
            self.line(json.dumps(obj, separators=(",", ":")))
        self.flush()

    def yaml(self, obj: object, *, document: bool = False) -> None:
        import yaml

        text = yaml.safe_dump(obj, sort_keys=False, default_flow_style=False)
        self.stdout.write(("---\n" if document else "") + text)

    def flush(self) -> None:
        self.stdout.flush()

    def note(self, message: str) -> None:
        """A diagnostic line on stderr."""
        self.stderr.write(f"dynamoctl: {message}\n")
        self.stderr.flush()

    def error(self, message: str) -> None:
        """The one line an error gets, on stderr; red on a terminal."""
        if wants_colour(self.stderr):
            from rich.console import Console

            console = Console(file=self.stderr, force_terminal=True, highlight=False)
            console.print(f"[bold red]dynamoctl: error:[/] {_escape(message)}", soft_wrap=True)
        else:
            self.stderr.write(f"dynamoctl: error: {message}\n")
        self.stderr.flush()

    @contextlib.contextmanager
    def progress(self, total: int, label: str) -> Iterator[Callable[[], None]]:
        """Yield ``advance()``; a progress bar on stderr when it is a terminal and the job is
        big enough to be worth one, else nothing is drawn."""
        if total < PROGRESS_MIN or not wants_colour(self.stderr):
            yield lambda: None
            return
        with _bar(self.stderr, total, label) as advance:
            yield advance

    async def confirm(self, question: str) -> bool:
        """Ask on stderr, read the answer from stdin (the caller checked it is a terminal)."""
        self.stderr.write(f"{question} [y/N] ")
        self.stderr.flush()
        import asyncio  # here: a command that asks nothing runs without an event loop

        answer = await asyncio.to_thread(sys.stdin.readline)
        return answer.strip().lower() in ("y", "yes")


PROGRESS_MIN = 10  # below this many workers a bar would only flicker


@contextlib.contextmanager
def _bar(stream: IO[str], total: int, label: str) -> Iterator[Callable[[], None]]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(file=stream, force_terminal=True)
    # auto_refresh=False: no refresh thread; each advance redraws.
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        auto_refresh=False,
    ) as bar:
        task = bar.add_task(label, total=total)

        def advance() -> None:
            bar.advance(task)
            bar.refresh()

        yield advance


STATE_STYLES = {
    "ready": "green", "cordoned": "yellow", "draining": "cyan", "drained": "blue",
    "unhealthy": "bold red", "excluded": "magenta",
}  # fmt: skip


class Screen:
    """A whole terminal redrawn in place (``dynamoctl top``): the alternate screen, left
    on exit with the cursor shown again, so the shell's screen comes back as it was.
    ``draw`` shows lines of text, a table and a status line; the table's ``mark`` column
    (when given) is the one shown as the sort column. Use as ``with Screen(stream) as
    screen``."""

    def __init__(self, stream: IO[str]) -> None:
        from rich.console import Console

        self.console = Console(file=stream, force_terminal=True, highlight=False)
        self._live: Any = None

    def __enter__(self) -> Screen:
        from rich.live import Live

        # auto_refresh=False: no refresh thread; each draw redraws.
        self._live = Live(
            console=self.console, screen=True, auto_refresh=False, redirect_stdout=False,
            redirect_stderr=False,
        )  # fmt: skip
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.__exit__(None, None, None)

    @property
    def size(self) -> tuple[int, int]:
        """Columns and lines of the terminal now."""
        width, height = self.console.size
        return width, height

    def draw(
        self,
        lines: Sequence[str],
        headers: Sequence[str],
        rows: Sequence[Sequence[str]],
        status: str,
        *,
        mark: int | None = None,
    ) -> None:
        self._live.update(_frame(lines, headers, rows, status, mark), refresh=True)


def frame_svg(
    lines: Sequence[str],
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    status: str,
    *,
    width: int = 120,
    title: str = "dynamoctl top",
) -> str:
    """One frame of ``Screen.draw`` as an SVG picture (rich's export), for documentation."""
    import io

    from rich.console import Console

    console = Console(file=io.StringIO(), width=width, record=True, force_terminal=True)
    console.print(_frame(lines, headers, rows, status, None))
    return str(console.export_svg(title=title))


def _frame(
    lines: Sequence[str],
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    status: str,
    mark: int | None,
) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold reverse")
    for index, name in enumerate(headers):
        shown = f"{name}{'*' if index == mark else ''}"
        table.add_column(shown, no_wrap=True, overflow="ellipsis", max_width=_widest(name))
    state = headers.index("STATE") if "STATE" in headers else -1
    for cells in rows:
        styled = [
            Text(cell, style=STATE_STYLES.get(cell, "") if index == state else "")
            for index, cell in enumerate(cells)
        ]
        table.add_row(*styled)
    head = [Text(line, style="bold" if index == 0 else "") for index, line in enumerate(lines)]
    return Group(*head, Text(""), table, Text(status, style="reverse"))


def _widest(header: str) -> int | None:
    """The widest a column may grow: taints and marks are cut (ellipsis), not wrapped."""
    return {"TAINTS": 40, "POOLS": 24, "MARK": 48, "MODEL": 32}.get(header)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
