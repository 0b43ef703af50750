"""The daemon's one memory budget, with real processes (issue 28: relayed answers were
bounded each, not in total): a real ``dynamod`` with ``DYNAMO_MEMORY_BUDGET_MB=16`` and a
worker whose whole answers are 6 MiB; eight clients ask and never read (48 MiB held for
them without the budget). The answers holding the most are refused past 16 MiB, each with
a warning naming the setting, counted in ``dynamod_memory_refusals_total``; what is held
(``dynamod_memory_held_bytes``) stays within the budget, and an honest client is answered
meanwhile."""

from __future__ import annotations

import contextlib
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest

from tests.hostile_workers.test_front import MODEL, client, fake_worker, front, post, requiring
from tests.support.eventually import eventually
from tests.support.processes import Proc, running, worker

pytestmark = pytest.mark.timeout(180)

BUDGET = {
    "DYNAMO_MEMORY_BUDGET_MB": "16",
    "DYNAMO_MAX_ANSWER_MB": "8",
    "DYNAMO_MAX_EVENT_MB": "1",
    "DYNAMO_TOKENIZER_BUNDLE_MAX_MB": "8",
}


@contextlib.contextmanager
def never_reading(base: str, body: dict[str, object]) -> Iterator[socket.socket]:
    """A client that asks for a whole answer and never reads a byte of it."""
    where = urlsplit(base)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((where.hostname, where.port))
    raw = json.dumps(body)
    sock.sendall(
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(raw)}\r\n\r\n{raw}".encode()
    )
    try:
        yield sock
    finally:
        sock.close()


async def series(http: aiohttp.ClientSession, daemon: Proc, name: str) -> float:
    async with http.get(f"{daemon.field('http')}/metrics") as reply:
        found = re.search(rf"^{name} (\S+)$", await reply.text(), re.MULTILINE)
    return float(found.group(1)) if found else -1.0


async def test_whole_answers_for_clients_that_never_read_stay_within_the_daemons_budget(
    tmp_path: Path,
) -> None:
    store = (tmp_path / "store").as_uri()
    large = ("--id", "b" * 16, "--mode", "large", "--size-mb", "6", "--taint", "large")
    body = {"model": MODEL, "prompt": "hello world", "max_tokens": 2}
    async with (
        running(fake_worker(store, *large)) as big,
        running(worker(store, "--taint", "honest")) as honest,
        running(front(store, tmp_path, workers=2, **BUDGET)) as daemon,
        client() as http,
    ):
        url = daemon.field("http")
        assert (await post(http, url, {**body, **requiring("honest")}))[0] == 200
        assert await series(http, daemon, "dynamod_memory_limit_bytes") == 16 << 20
        with contextlib.ExitStack() as clients:
            for _ in range(8):
                clients.enter_context(never_reading(url, {**body, **requiring("large")}))
            refused = await eventually(
                lambda: series(http, daemon, "dynamod_memory_refusals_total"),
                lambda n: n >= 3,
                within=60,
                what="answers held for clients that never read refused",
            )
            assert refused >= 3  # 8 of 6 MiB: at most 2 fit in 16 MiB
            assert 0 <= await series(http, daemon, "dynamod_memory_held_bytes") <= 16 << 20
            status, _, worker_id = await post(http, url, {**body, **requiring("honest")})
            assert (status, worker_id) == (200, honest.field("id"))
        said = f"the answer of worker {big.field('id')} is refused: the daemon holds"
        assert said in daemon.stderr and "(memory_budget_mb = 16)" in daemon.stderr
