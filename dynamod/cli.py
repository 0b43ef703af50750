"""The ``dynamod`` entry point."""

from __future__ import annotations

import sys

from dynamod import __version__


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--version"]:
        print(f"dynamod {__version__}")
        return 0
    print("dynamod: the daemon is not built yet; try --version", file=sys.stderr)
    return 2
