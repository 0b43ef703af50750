"""Nothing the suite starts outlives it: the processes still alive when every fixture is
done fail the run, each named by its command line, and are then killed.

``tests/conftest.py`` runs ``check()`` in the teardown of a session fixture that every test
uses and that is set up before any other, so it is torn down after all of them (with
xdist, once in each worker). A process that has exited but was not waited for (a zombie)
is gone already and does not count; one that is on its way out gets ``GRACE`` seconds.
"""

from __future__ import annotations

import psutil

GRACE = 10.0


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for process in processes:
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.NoSuchProcess:
            continue
    return alive


def _command(process: psutil.Process) -> str:
    try:
        return f"pid {process.pid}: {' '.join(process.cmdline()) or process.name()}"
    except psutil.Error:
        return f"pid {process.pid}"


def leftovers(grace: float = GRACE) -> list[psutil.Process]:
    """Our descendants still alive after ``grace`` seconds."""
    children = _alive(psutil.Process().children(recursive=True))
    if not children:
        return []
    _, alive = psutil.wait_procs(children, timeout=grace)
    return _alive(alive)


def check(grace: float = GRACE) -> str:
    """The message naming every process still alive (empty when none is); they are killed."""
    alive = leftovers(grace)
    if not alive:
        return ""
    named = [_command(p) for p in alive]
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(alive, timeout=5)
    return "processes the suite started outlived it (killed now):\n" + "\n".join(
        f"  {line[:500]}" for line in named
    )
