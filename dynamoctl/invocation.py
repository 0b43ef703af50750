"""The global options' values, the one object every command reads (``Options``), without
typer: ``direct.py`` builds it by hand for the commands scripts run in loops, and
``options.from_context`` from click's parse for every other command line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dynamod.client.endpoint import DEFAULT_TIMEOUT, default_endpoint

OUTPUTS = ("table", "wide", "json", "yaml", "name")


@dataclass(frozen=True)
class Options:
    """Everything a command needs to know besides its own arguments."""

    endpoint: str | None = None
    token_file: Path | None = None
    tls: bool = False
    cacert: Path | None = None
    cert: Path | None = None
    cert_key: Path | None = None
    timeout: float = DEFAULT_TIMEOUT
    output: str = "table"
    no_headers: bool = False
    debug: bool = False
    context: str | None = None

    def target(self) -> str:
        """The endpoint to dial: the flag, else the daemon's default unix socket."""
        return self.endpoint or default_endpoint()


FIELDS = tuple(Options.__dataclass_fields__)
