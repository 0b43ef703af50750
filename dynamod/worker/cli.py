"""The ``dynamo-worker`` entry point."""

from __future__ import annotations

import sys

from dynamod import __version__


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--version"]:
        print(f"dynamo-worker {__version__}")
        return 0
    print("dynamo-worker: the worker runtime is not built yet; try --version", file=sys.stderr)
    return 2
