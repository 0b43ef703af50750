"""CPU time and memory bounds of a prompt process (``child.py``), which runs models' own
tokenizers and chat templates: code from workers, which the daemon does not trust.

``cpu_budget(seconds)`` bounds the CPU time of a block twice over:

* a profiling timer (``ITIMER_PROF``, CPU time of the process) whose signal raises
  ``CpuBudgetExceeded`` in the block, between two Python steps: a template looping in
  Jinja stops there, and the process goes on serving;
* the kernel's ``RLIMIT_CPU``, set a second past the budget (whole seconds), for code that
  never returns to Python (a tokenizer's Rust pipeline): ``SIGXCPU`` ends the process, and
  the daemon replaces it (``processes.py`` tells the request which bound it was).

``limit_memory(size)`` caps the process's address space (``RLIMIT_AS``): an allocation
past it fails (``MemoryError`` in Python; a Rust allocation ends the process), so a
memory bomb costs the prompt process, never the daemon.

Signals reach the main thread only, so a budget is for a process's main thread: the
prompt process runs one job at a time there.
"""

from __future__ import annotations

import contextlib
import math
import resource
import signal
from collections.abc import Iterator
from types import FrameType

GRACE = 1
"""Whole seconds the kernel's limit allows past the budget, for the timer to act first."""


class CpuBudgetExceeded(BaseException):
    """The block ran past its CPU budget. A ``BaseException``, as ``KeyboardInterrupt`` is:
    no ``except Exception`` in the code being run (a template's, a library's) swallows it."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"ran past its CPU-time bound of {seconds:.3g} s")
        self.seconds = seconds


class _Timer:
    """Which budget is running; the signal handler acts only while one is."""

    seconds: float | None = None


def install() -> None:
    """Route the profiling timer's signal to ``cpu_budget``: call once, in the main thread."""
    signal.signal(signal.SIGPROF, _expired)


def _expired(signum: int, frame: FrameType | None) -> None:
    # A signal that arrives just after the block ended finds no budget running: ignored.
    if _Timer.seconds is not None:
        raise CpuBudgetExceeded(_Timer.seconds)


@contextlib.contextmanager
def cpu_budget(seconds: float) -> Iterator[None]:
    """Run the block within ``seconds`` of CPU time; see the module docstring."""
    used = _cpu_used()
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    ceiling = math.ceil(used + seconds) + GRACE
    if hard != resource.RLIM_INFINITY:
        ceiling = min(ceiling, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (ceiling, hard))
    _Timer.seconds = seconds
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        _Timer.seconds = None
        signal.setitimer(signal.ITIMER_PROF, 0)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _cpu_used() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def limit_memory(size: int) -> None:
    """Cap this process's address space at ``size`` bytes (below a hard limit already set)."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        size = min(size, hard)
    resource.setrlimit(resource.RLIMIT_AS, (size, hard))
