"""The ``dynamoctl`` entry point."""

from __future__ import annotations

import sys

from dynamod import __version__


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--version"]:
        print(f"dynamoctl {__version__}")
        return 0
    print("dynamoctl: commands are not built yet; try --version", file=sys.stderr)
    return 2
