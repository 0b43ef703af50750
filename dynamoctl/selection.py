"""The CLI side's one check of a selector (``-l``), before anything is sent; without typer,
so the commands ``direct.py`` runs use it too."""

from __future__ import annotations


def check_selector(text: str | None) -> None:
    """The daemon's own parser, run before any call: a bad selector never reaches the wire
    and fails with the daemon's very message (``SelectorError``). Nothing is imported for
    no selector."""
    if text:
        from dynamod.selectors import parse

        parse(text)
