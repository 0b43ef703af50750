"""What a model's own tokenizer may cost the process that runs it.

A worker publishes its tokenizer (``bundle.py``) and the daemon runs it: its
``tokenizer.json`` pipeline and its Jinja chat template are code the daemon did not write,
so each use is bounded in bytes, characters, CPU time and memory. ``TokenizerLimits`` holds
those bounds; the daemon's settings (``tokenizer_bundle_max_mb`` and the rest) make one.
Where each bound is enforced: the bundle's bytes and the cache by the daemon's registry
(``boundary/tokenizer_registry.py``); the rendered characters by the template's own
sandbox (``hf.py``); CPU time and memory by the prompt processes that run it
(``prompts/cpu_budget.py``, ``prompts/child.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dynamod.errors import InvalidInputError

MIB = 1024 * 1024
MIN_PROCESS_MEMORY = 256 * MIB


@dataclass(frozen=True)
class TokenizerLimits:
    """``bundle_bytes``: the largest tokenizer bundle fetched from a worker.
    ``cache_bytes``: bundles kept, in the daemon and in each prompt process.
    ``cpu_seconds``: CPU time a model's tokenizer may take for one request (rendering the
    chat template and encoding), plus as much again per MiB of the prompt's text.
    ``max_output``: characters a chat template may render for one request.
    ``process_memory``: the address space of one prompt process, in bytes."""

    bundle_bytes: int = 128 * MIB
    cache_bytes: int = 256 * MIB
    cpu_seconds: float = 2.0
    max_output: int = 32 * MIB
    process_memory: int = 4096 * MIB

    def __post_init__(self) -> None:
        for name in ("bundle_bytes", "cache_bytes", "max_output", "process_memory"):
            if getattr(self, name) < 1:
                raise InvalidInputError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.process_memory < MIN_PROCESS_MEMORY:
            raise InvalidInputError(
                f"process_memory must be at least {MIN_PROCESS_MEMORY // MIB} MiB (a Python "
                f"process with the tokenizers library), got {self.process_memory // MIB} MiB"
            )
        if self.cache_bytes < self.bundle_bytes:
            raise InvalidInputError(
                f"cache_bytes ({self.cache_bytes}) must hold at least one bundle of "
                f"bundle_bytes ({self.bundle_bytes})"
            )
        if not math.isfinite(self.cpu_seconds) or not 0 < self.cpu_seconds <= 3600:
            raise InvalidInputError(
                f"cpu_seconds must be above 0 and at most 3600, got {self.cpu_seconds!r}"
            )

    def cpu_for(self, characters: int) -> float:
        """The CPU seconds a tokenizer call over ``characters`` of text may take."""
        return self.cpu_seconds * (1 + characters / MIB)
