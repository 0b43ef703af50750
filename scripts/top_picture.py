"""Draw one frame of ``dynamoctl top`` as an SVG picture (rich's export), for the README.

    DYNAMO_ENDPOINT=unix:///PATH/dynamod.sock python -m scripts.top_picture docs/dynamoctl-top.svg

It takes the first frame with rates from the daemon's stats stream, exactly as ``dynamoctl
top`` asks for it (sorted by load), and draws the lines and the table the live screen
draws (``dynamoctl.top_frames``, ``dynamoctl.output.frame_svg``).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from dynamoctl import top_frames, top_live
from dynamoctl.output import frame_svg
from dynamod.client import AsyncClient
from dynamod.stats_results import FleetStats, StatsQuery


async def first_frame(limit: int) -> FleetStats:
    async with AsyncClient() as client:
        async for frame in client.watch_stats(StatsQuery(limit=limit)):
            if frame.interval:
                return frame
    raise SystemExit("the daemon ended the stream before its first frame")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--width", type=int, default=118)
    parser.add_argument("--rows", type=int, default=20)
    args = parser.parse_args()
    frame = asyncio.run(first_frame(args.rows))
    status = f"{top_frames.sorted_by('load', False)}  rows 1-{len(frame.rows)} of {frame.matched}"
    svg = frame_svg(
        top_frames.header_lines(frame), top_frames.HEADERS, top_frames.rows(frame),
        f"{status}  {top_live.HELP}", width=args.width,
    )  # fmt: skip
    args.out.write_text(svg)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
