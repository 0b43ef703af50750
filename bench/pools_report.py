"""The *Pools* section of ``RESULTS.md``, from the saved output of ``python -m bench.pools``
and ``python -m bench.pools_plan`` (``python -m bench.report --pools OUT...``). A full
report run keeps the section as it is: neither benchmark is rerun there (``bench.pools``
runs 10,000-worker fleets for minutes)."""

from __future__ import annotations

from pathlib import Path

TITLE = "Pools (`bench.pools`, `bench.pools_plan`)"
COMMANDS = {
    "pools": "python -m bench.pools --json bench/out/pools.json > bench/out/pools.txt",
    "pools_plan": "python -m bench.pools_plan > bench/out/pools_plan.txt",
}


def section(files: list[Path]) -> list[str]:
    """Markdown lines for the section body: each file's text in a block, under the command
    that printed it (recognised by the first line: ``# pool policies`` or ``# pools plan``)."""
    out = [
        "Convergence of pool policies on etcd (apply -> every taint written -> seen by the "
        "other daemon's view, which its router is fed from), moves against the fewest under "
        "a churn trace (its row counts moves only; a time there reads 0.00 or -), and plan "
        "time in process. Target (issue 23): convergence at 1,000 workers <= 2 s on etcd; a "
        "plan <= 10 ms at 10,000 workers.",
        "",
    ]
    for path in files:
        text = path.read_text().rstrip()
        name = "pools_plan" if text.startswith("# pools plan") else "pools"
        out += [f"`{COMMANDS[name]}`:", "", "```", text, "```", ""]
    return out
