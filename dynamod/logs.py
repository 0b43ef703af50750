"""Logging for the daemons: plain lines under journald, timestamped otherwise, JSON on
request. journald adds its own timestamps and levels, so under it (``$JOURNAL_STREAM``
set) a line is just ``<level> <logger>: <message>``."""

from __future__ import annotations

import json
import logging
import os
import sys


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def grpc_errors_only() -> None:
    """gRPC's own C core logs errors only (``GRPC_VERBOSITY=ERROR``) unless the operator set
    it: its info lines ("skipping fork() handlers" as a prompt process starts, "Got goaway")
    say nothing an operator can act on. Called first by the servers' entry points, before
    gRPC is imported, which is when the C core reads it."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


def configure(level: str = "info", style: str = "auto") -> None:
    """Set up the root logger on stderr (``style``: auto, plain or json)."""
    if style == "auto":
        style = "plain" if os.environ.get("JOURNAL_STREAM") else "timestamped"
    formatter: logging.Formatter
    if style == "json":
        formatter = JsonFormatter()
    elif style == "plain":
        formatter = logging.Formatter("%(levelname)s %(name)s: %(message)s")
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
