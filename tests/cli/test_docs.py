"""The man pages render cleanly and cover the live CLIs. (That they are fresh is
tests/test_generated.py's job.)"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import fields

import pytest

from dynamoctl.app import command
from dynamod.lifecycle import EX_FAILURE, EX_OK, EX_SOFTWARE, EX_UNAVAILABLE
from dynamod.main import EX_CONFIG
from dynamod.router.knobs import RouterKnobs
from dynamod.settings import DaemonSettings
from scripts.docs import esc
from tests.support.processes import ROOT

PAGES = ("dynamoctl.1", "dynamod.8", "dynamo-worker.1")


@pytest.mark.parametrize("page", PAGES)
def test_the_page_renders_without_a_single_warning(page: str) -> None:
    groff = shutil.which("groff")
    assert groff, "groff is needed to check the man pages (apt-get install groff)"
    done = subprocess.run(
        [groff, "-man", "-ww", "-z", str(ROOT / "man" / page)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")


def test_dynamoctl_1_documents_every_command_and_global_option() -> None:
    page = (ROOT / "man" / "dynamoctl.1").read_text()
    cli = command()
    for group, sub in cli.commands.items():
        names = [f"{group} {n}" for n in getattr(sub, "commands", {})] or [group]
        for name in names:
            assert f'.SS "{name}"'.replace("-", "\\-") in page, name  # roff escapes "-"
    for param in cli.params:
        for flag in param.opts:
            assert esc(flag) in page, flag
    for section in ("EXIT STATUS", "ENVIRONMENT", "FILES", "EXAMPLES", "SELECTORS"):
        assert f".SH {section}" in page


@pytest.mark.parametrize(
    ("page", "sections"),
    [
        ("dynamod.8", ("SIGNALS", "SYSTEMD", "EXIT STATUS", "FILES", "ENVIRONMENT", "EXAMPLES")),
        ("dynamo-worker.1", ("SYSTEM HTTP API", "SIGNALS", "EXIT STATUS", "ENVIRONMENT")),
    ],
)
def test_the_daemon_pages_have_their_sections(page: str, sections: tuple[str, ...]) -> None:
    text = (ROOT / "man" / page).read_text()
    for section in sections:
        assert f".SH {section}" in text or f'.SH "{section}"' in text, section


def test_dynamod_8_documents_every_setting_and_exit_status() -> None:
    """Each key of the configuration file and of its ``[router]`` table, and each exit
    status the daemon uses, has its place in CONFIGURATION and EXIT STATUS."""
    text = (ROOT / "man" / "dynamod.8").read_text()
    configuration = text[text.index(".SH CONFIGURATION") : text.index(".SH STORE URLS")]
    keys = [f.name for f in fields(DaemonSettings) if f.name != "router"]
    keys += [f.name for f in fields(RouterKnobs)]
    words = set(re.findall(r"[a-z_]+", esc_free(configuration)))
    assert not [k for k in keys if k not in words], "settings missing from dynamod(8)"
    statuses = text[text.index(".SH EXIT STATUS") : text.index(".SH ENVIRONMENT")]
    codes = {EX_OK, EX_FAILURE, EX_UNAVAILABLE, EX_SOFTWARE, EX_CONFIG}
    assert {int(c) for c in re.findall(r"^\.B (\d+)$", statuses, re.M)} >= codes


def esc_free(roff: str) -> str:
    """Roff text with its escaped hyphens as plain ones."""
    return roff.replace("\\-", "-")
