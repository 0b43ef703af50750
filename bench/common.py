"""What the store benchmarks share: servers, percentiles, the table, JSON, an owned task.

Servers are the test fixtures' own (``tests.support.servers``): real etcd and nats-server binaries
from the dev dependencies, on free loopback ports, in a temporary directory that is removed
on the way out, Ctrl-C included. Latencies are kept as integer nanoseconds and shown in
milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dynamod.tasks import cancel_and_wait
from tests.support.servers import EtcdServer, NatsServer, etcd_binary, nats_binary

SERVER_BACKENDS = ("etcd", "nats")


@dataclass(frozen=True)
class Stats:
    """Percentiles of one series of samples, in milliseconds."""

    n: int
    p50_ms: float
    p99_ms: float
    min_ms: float
    max_ms: float

    @classmethod
    def of(cls, samples_ns: Sequence[int]) -> Stats:
        """Nearest-rank percentiles; an empty series is a bug in the caller."""
        if not samples_ns:
            raise ValueError("cannot summarize an empty series of samples")
        ordered = sorted(samples_ns)
        return cls(
            n=len(ordered),
            p50_ms=percentile(ordered, 0.50) / 1e6,
            p99_ms=percentile(ordered, 0.99) / 1e6,
            min_ms=ordered[0] / 1e6,
            max_ms=ordered[-1] / 1e6,
        )


def percentile(ordered: Sequence[int], q: float) -> int:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of an ascending, non-empty series."""
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def overhead(ours: Stats, floor: Stats | None, *, ratio: bool = True) -> str:
    """How much the p50 costs above the floor's: ``+0.123 ms (1.8x)``. Leave the ratio out
    where the floor is a difference of two moments that may be near zero."""
    if floor is None:
        return "—"
    extra = f"{ours.p50_ms - floor.p50_ms:+.3f} ms"
    if not ratio or floor.p50_ms <= 0:
        return extra
    return f"{extra} ({ours.p50_ms / floor.p50_ms:.1f}x)"


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table: text columns left-aligned, numeric-looking ones right-aligned."""
    widths = [max(len(r[i]) for r in (headers, *rows)) for i in range(len(headers))]
    numeric = [all(_numeric(r[i]) for r in rows) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        parts = (
            c.rjust(w) if right else c.ljust(w)
            for c, w, right in zip(cells, widths, numeric, strict=True)
        )
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """A Markdown table, as lines, followed by a blank line."""
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return [*out, ""]


def _numeric(cell: str) -> bool:
    return cell == "—" or cell[:1] in "+-0123456789"


def _first_line(argv: list[str]) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True)
    return out.stdout.strip().splitlines()[0]


def versions() -> dict[str, str]:
    """Versions of etcd, nats-server and Python, as they report themselves."""
    etcd = _first_line([str(etcd_binary()), "--version"])  # "etcd Version: 3.5.1"
    nats = _first_line([str(nats_binary()), "--version"])  # "nats-server: v2.15.1"
    return {
        "etcd": etcd.rpartition(" ")[2],
        "nats-server": nats.rpartition(" ")[2].lstrip("v"),
        "python": platform.python_version(),
    }


def header(title: str, found: dict[str, str], detail: str) -> str:
    runtime = ", ".join(f"{name} {version}" for name, version in found.items())
    return f"# {title}: {detail}\n# {runtime}; {platform.machine()}, {_cpus()} CPUs\n"


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass(frozen=True)
class Places:
    """Where each backend lives for one run: a store URL per backend, and the scratch dir."""

    urls: dict[str, str]
    etcd_endpoint: str | None
    nats_address: str | None
    scratch: Path


@contextlib.contextmanager
def places(backends: Sequence[str], *, bucket: str = "bench") -> Iterator[Places]:
    """Start the servers ``backends`` need; stop them and remove every file on exit."""
    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dynamod-bench-")))
        urls = {"memory": "memory://", "file": (scratch / "file-store").as_uri()}
        etcd_endpoint = nats_address = None
        if "etcd" in backends:
            etcd = EtcdServer(scratch / "etcd")
            stack.enter_context(etcd)
            urls["etcd"], etcd_endpoint = etcd.url("bench"), etcd.endpoint
        if "nats" in backends:
            nats = NatsServer(scratch / "nats")
            stack.enter_context(nats)
            urls["nats"], nats_address = nats.url(bucket), f"nats://127.0.0.1:{nats.port}"
        yield Places({b: urls[b] for b in backends}, etcd_endpoint, nats_address, scratch)


def write_json(path: Path | None, document: dict[str, Any]) -> None:
    if path is not None:
        path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")


def write_result(document: dict[str, Any], benchmark: str, given: Path | None) -> Path:
    """Write ``document`` to ``given``, else to ``bench/out/<benchmark>-<UTC time>.json``
    (the files ``bench.report --peer`` / ``--prefix`` read); say where on stderr."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = given or Path(__file__).resolve().parent / "out" / f"{benchmark}-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, document)
    print(f"wrote {out}", file=sys.stderr)
    return out


def stats_json(stats: Stats | None) -> dict[str, Any] | None:
    return None if stats is None else asdict(stats)


@contextlib.asynccontextmanager
async def owned(coro: Coroutine[Any, Any, None], name: str) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``coro`` as a task for the body of the ``async with``; then cancel and await it.

    A task that failed while the body ran re-raises its error on exit. The body's own
    cancellation is never swallowed: only the ``CancelledError`` we caused is absorbed.
    """
    task = asyncio.create_task(coro, name=name)
    try:
        yield task
    finally:
        await cancel_and_wait(task)


def interruptible(main: Callable[[], int]) -> int:
    """``main()``, where Ctrl-C unwinds every ``with`` (servers, temp dirs) and exits 130."""
    try:
        return main()
    except KeyboardInterrupt:
        print("interrupted; servers stopped and scratch files removed", file=sys.stderr)
        return 130
