"""The JSON codec on the front's hot path: the standard library against orjson.

Every text prompt the front tokenizes is forwarded with its token ids in the body
(``nvext.token_ids``), written by the front and read again by the worker, so a long
prompt's ids are encoded and decoded once per request. This times both codecs on such a
body (``--tokens`` ids), best of 5 repeats of 20 calls each; the standard library is the
floor.

    python -m bench.codec [--tokens 100000]
"""

from __future__ import annotations

import argparse
import json
import platform
import timeit
from collections.abc import Callable

import orjson

from bench.common import render_table


def _best_ms(call: Callable[[], object]) -> float:
    return min(timeit.repeat(call, number=20, repeat=5)) / 20 * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=100_000)
    args = parser.parse_args()
    body = {"model": "m", "prompt": "x", "nvext": {"token_ids": list(range(args.tokens))}}
    raw = json.dumps(body, separators=(",", ":")).encode()
    rows = []
    for what, floor, ours in (
        (
            "encode",
            lambda: json.dumps(body, separators=(",", ":")).encode(),
            lambda: orjson.dumps(body),
        ),
        ("decode", lambda: json.loads(raw), lambda: orjson.loads(raw)),
    ):
        std, fast = _best_ms(floor), _best_ms(ours)
        rows.append([what, f"{std:.2f}", f"{fast:.2f}", f"{std / fast:.1f}x"])
    print(f"# codec: a body of {args.tokens} token ids ({len(raw)} bytes)")
    print(f"# python {platform.python_version()}, orjson {orjson.__version__}\n")
    print(render_table(["op", "json ms", "orjson ms", "speed-up"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
