"""Compressed answers from workers (issue 28), with real processes: the front asks for
``identity`` and does not let aiohttp inflate on the loop; a gzip bomb (64 MiB in a few
hundred KiB) is inflated slice by slice only up to the answer limit, then refused with a
502 naming the worker, and the daemon's peak memory stays near it; an honest gzip answer
is passed on decoded."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tests.hostile_workers.test_front import (
    MIB,
    MODEL,
    client,
    fake_worker,
    front,
    peak_rss,
    post,
    requiring,
)
from tests.support.processes import running

pytestmark = pytest.mark.timeout(180)


async def test_a_gzip_bomb_is_refused_at_the_limit_and_an_honest_gzip_answer_passes(
    tmp_path: Path,
) -> None:
    store = (tmp_path / "store").as_uri()
    body = {"model": MODEL, "prompt": "hello world", "max_tokens": 2}
    bomb = ("--id", "b" * 16, "--mode", "gzip-bomb", "--size-mb", "64", "--taint", "bomb")
    async with (
        running(fake_worker(store, *bomb)) as bomber,
        running(fake_worker(store, "--id", "c" * 16, "--mode", "gzip", "--taint", "zip")) as z,
        running(front(store, tmp_path, workers=2, DYNAMO_MAX_ANSWER_MB="4")) as daemon,
        client() as http,
    ):
        url = daemon.field("http")
        status, answer, worker_id = await post(http, url, {**body, **requiring("zip")})
        assert (status, worker_id) == (200, z.field("id")), answer
        assert answer["choices"][0]["text"]
        before = peak_rss(daemon.pid)
        for _ in range(3):
            status, error, worker_id = await post(http, url, {**body, **requiring("bomb")})
            assert (status, worker_id) == (502, bomber.field("id")), error
            said = error["error"]["message"]
            assert said.startswith(f"worker {bomber.field('id')} sent too large an answer: ")
            assert "(inflated) is over its limit of 4194304 bytes" in said
        assert peak_rss(daemon.pid) - before < 32 * MIB
    assert len(gzip.compress(b" " * MIB)) < 2 * 1024  # what makes it a bomb
