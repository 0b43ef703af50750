"""The man pages render cleanly and cover the live CLIs. (That they are fresh is
tests/test_generated.py's job.)"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from dynamoctl.app import command
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
            assert f'.SS "{name}"' in page, name
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
