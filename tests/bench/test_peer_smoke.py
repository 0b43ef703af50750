"""``python -m bench.peer`` runs whole on this machine: a smoke run, one round of small counts,
against NVIDIA Dynamo 1.6.1 from its cached venv (built before the session when the cache is
empty, as a fresh machine has it: marker ``dynamo``, ``tests/support/envs.py``). It once
crashed on a fresh machine: a helper's answer was one line over asyncio's 64 KiB stream
limit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import envs
from tests.support.servers import require_servers

pytestmark = pytest.mark.dynamo
ROOT = Path(__file__).resolve().parents[2]


def test_the_peer_benchmark_runs_start_to_end(tmp_path: Path) -> None:
    try:
        envs.dynamo_venv()
    except envs.EnvMissing as exc:
        if require_servers():
            pytest.fail(f"CI needs NVIDIA Dynamo: {exc}")
        pytest.skip(str(exc))
    out = tmp_path / "peer.json"
    argv = [sys.executable, "-m", "bench.peer", "--rounds", "1", "--requests", "20",
            "--streams", "4", "--seconds", "2", "--concurrency", "32", "--updates", "4",
            "--json", str(out)]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    document = json.loads(out.read_text())
    assert document["rows"], "the run produced no figures"
    samples = document["raw"]
    assert samples, "no raw samples were kept"
