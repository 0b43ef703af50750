"""Generated files (protobuf stubs, completions, man pages) match their sources."""

from __future__ import annotations

import subprocess
import sys

from tests.support.processes import ROOT


def test_generated_files_are_fresh() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "scripts.generate", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
