"""The NVIDIA Dynamo 1.6.1 virtualenv the peer benchmark runs: built once, then reused.

Dynamo's frontend and mocker come from PyPI (``ai-dynamo``, ``ai-dynamo-runtime``) and
live in their own virtualenv, outside the repository and away from ours: their
dependencies (transformers, uvloop, a Rust extension) must not touch the project's.

``ai-dynamo==1.6.1`` requires ``aisimulate==0.13.0``, a PyPI placeholder whose install
downloads from a host this machine cannot reach; only Dynamo's planner needs it. So
``ai-dynamo`` goes in with ``--no-deps`` and the runtime with the dependencies the frontend
and mocker really import (``REQUIREMENTS``, from the package's metadata minus aisimulate).

The venv is built in ``<dir>.partial-<pid>`` and renamed into place only once Dynamo
imports there, with a ``dynamod-bench.json`` stamp naming what was installed: an
interrupted install leaves no half venv to be mistaken for a good one, and the next build
removes what a killed one left. Builders take ``<dir>.lock`` (``flock``) first, so two
runs at once build it once. Its programs are
started with ``<venv>/bin/python -m ...``, never through entry-point scripts, so the venv
works at the path it was renamed to.

``python -m bench.peer.venv`` builds it (``scripts/test`` does, before pytest starts).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DYNAMO_VERSION = "1.6.1"
REQUIREMENTS = (
    f"ai-dynamo-runtime=={DYNAMO_VERSION}",
    "aiohttp>=3.14.3,<4",
    "certifi",
    "kubernetes>=32.0.1,<33",
    "msgspec>=0.19",
    "prometheus-client>=0.23.1,<1",
    "pyzmq>=26",
    "redis>=6.2,<9",
    "tqdm",
    "transformers>=4.56",
    "typing-extensions",
    "zstandard>=0.23,<1",
)
STAMP = "dynamod-bench.json"
# What the benchmark needs to import there: the frontend, the mocker, the taint route.
IMPORT_CHECK = "import dynamo.frontend, dynamo.mocker, dynamo.common.model_taints, tokenizers"


def default_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "dynamod-bench" / f"dynamo-{DYNAMO_VERSION}"


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


@contextlib.contextmanager
def _locked(venv: Path) -> Iterator[None]:
    """Hold ``<venv>.lock``: one builder at a time, across processes."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.with_name(f"{venv.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure(venv: Path) -> dict[str, Any]:
    """The stamp of a ready venv at ``venv``; installs it first if there is none."""
    with _locked(venv):
        return _ensure(venv)


def _ensure(venv: Path) -> dict[str, Any]:
    stamp = venv / STAMP
    if stamp.exists():
        found: dict[str, Any] = json.loads(stamp.read_text())
        if found.get("requirements") == list(_wanted()):
            return found
        raise RuntimeError(
            f"{venv} holds a Dynamo venv built from other requirements than this benchmark's; "
            "remove it or pass --dynamo-venv with another directory"
        )
    if venv.exists():
        raise RuntimeError(f"{venv} exists but has no {STAMP}: not a venv this benchmark built")
    return _install(venv)


def _wanted() -> tuple[str, ...]:
    return (f"ai-dynamo=={DYNAMO_VERSION} (--no-deps)", *REQUIREMENTS)


def _install(venv: Path) -> dict[str, Any]:
    for stale in venv.parent.glob(f"{venv.name}.partial-*"):  # a killed build's (we hold the lock)
        shutil.rmtree(stale, ignore_errors=True)
    partial = venv.with_name(f"{venv.name}.partial-{os.getpid()}")
    print(
        f"installing Dynamo {DYNAMO_VERSION} into {venv} (first run only; pip's complaint "
        "that aisimulate is missing is expected: see bench/peer/venv.py)",
        file=sys.stderr,
    )
    started = time.monotonic()
    try:
        subprocess.run([sys.executable, "-m", "venv", str(partial)], check=True)
        pip = [str(python_of(partial)), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, "--no-deps", f"ai-dynamo=={DYNAMO_VERSION}"], check=True)
        subprocess.run([*pip, *REQUIREMENTS], check=True)
        check = [str(python_of(partial)), "-c", IMPORT_CHECK]
        subprocess.run(check, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        stamp = {
            "requirements": list(_wanted()),
            "installed_in_s": round(time.monotonic() - started, 1),
            "packages": _freeze(partial),
        }
        (partial / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
        partial.rename(venv)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return stamp


def _freeze(venv: Path) -> dict[str, str]:
    """Installed versions of the packages that decide what is measured."""
    argv = [
        str(python_of(venv)),
        "-m",
        "pip",
        "list",
        "--format=json",
        "--disable-pip-version-check",
    ]
    listed = json.loads(subprocess.run(argv, capture_output=True, check=True, text=True).stdout)
    keep = {"ai-dynamo", "ai-dynamo-runtime", "tokenizers", "transformers", "aiohttp", "uvloop"}
    return {p["name"]: p["version"] for p in listed if p["name"].lower() in keep}


def main() -> None:
    """Build the venv when missing, saying so and how long it took."""
    venv = default_dir()
    started = time.monotonic()
    ready = (venv / STAMP).exists()
    ensure(venv)
    took = time.monotonic() - started
    print(f"== Dynamo {DYNAMO_VERSION} venv {'cached' if ready else 'built'} in {venv} "
          f"({took:.0f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
