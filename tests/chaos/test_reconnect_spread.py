"""A fleet that lost its store reconnects spread out, not in lockstep: 50 clients (each a
store of its own, as 50 workers or daemons have) follow one etcd or nats-server through a
TCP proxy that records every connection they open. The proxy then refuses every
connection for a few seconds (the store is down, as far as the clients can tell) and lets
them through again. Each client retries on its own back-off (``dynamod.backoff``: full
jitter), so their attempts land all over the window; on one fixed schedule of delays the
whole fleet would knock at the same instants.

The measure is how many attempts share the busiest short window, not how fast anything
is: a busy machine only spreads attempts further. Every client must also recover."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from dynamod.store import Put, Resync, Store, open_store
from tests.support.servers import EtcdServer, NatsServer, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CLIENTS = 50
OUTAGE = 5.0  # seconds of refused connections: every back-off reaches its cap (2 s)
WINDOW = 0.05
"""Seconds of the window attempts are counted in."""
LOCKSTEP = CLIENTS // 2
"""Attempts in one window at or above which the fleet moves in lockstep. Full jitter over
a 2 s window puts a handful in the busiest 50 ms; one fixed schedule puts all 50."""
MARK = "v1/back"


class Proxy:
    """A TCP proxy to ``port`` that records when each connection was opened, and refuses
    them all (closes them at once) while ``down``."""

    def __init__(self, port: int) -> None:
        self.port = free_port()
        self._backend = port
        self.down = False
        self.opened: list[float] = []
        self._relays: set[asyncio.Task[None]] = set()

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[Proxy]:
        server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        try:
            yield self
        finally:
            server.close()
            await self.cut()
            await server.wait_closed()

    async def cut(self) -> None:
        """Close every connection open now."""
        relays = list(self._relays)
        for relay in relays:
            relay.cancel()
        await asyncio.gather(*relays, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.opened.append(time.monotonic())
        relay = asyncio.current_task()
        assert relay is not None
        self._relays.add(relay)
        try:
            if not self.down:
                await self._relay(reader, writer)
        finally:
            self._relays.discard(relay)
            writer.transport.abort()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._backend)
        except OSError:
            return
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            up_writer.transport.abort()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    except OSError:
        pass
    finally:
        sink.transport.abort()


async def recovered(store: Store, ready: asyncio.Event) -> None:
    """Follow ``v1``: ready at the first Resync; done once the key written after the
    outage arrives (the watch was re-established)."""
    async with store.watch("v1") as events:
        async for event in events:
            if isinstance(event, Resync) and not ready.is_set():
                ready.set()
            if (isinstance(event, Put) and event.entry.key == MARK) or (
                isinstance(event, Resync) and any(e.key == MARK for e in event.entries)
            ):
                return


def busiest(moments: list[float]) -> int:
    """The most moments within any ``WINDOW`` seconds."""
    moments = sorted(moments)
    start, most = 0, 0
    for end, moment in enumerate(moments):
        while moment - moments[start] > WINDOW:
            start += 1
        most = max(most, end - start + 1)
    return most


@pytest.fixture(params=["etcd", "nats"])
def server(request: pytest.FixtureRequest) -> tuple[str, int, str]:
    """(scheme, port, url of the store behind a proxy at PROXY)."""
    if request.param == "etcd":
        etcd: EtcdServer = request.getfixturevalue("private_etcd")
        return "etcd", etcd.port, "etcd://127.0.0.1:{proxy}/spread"
    nats: NatsServer = request.getfixturevalue("nats_server")
    return "nats", nats.port, "nats://127.0.0.1:{proxy}/spread"


async def test_fifty_clients_reconnect_spread_over_the_back_off_window(
    server: tuple[str, int, str],
) -> None:
    _, port, url_template = server
    proxy = Proxy(port)
    async with proxy.serving():
        url = url_template.format(proxy=proxy.port)
        stores = [await open_store(url) for _ in range(CLIENTS)]
        try:
            async with asyncio.TaskGroup() as group:
                ready = [asyncio.Event() for _ in stores]
                tasks = [
                    group.create_task(recovered(s, e)) for s, e in zip(stores, ready, strict=True)
                ]
                async with asyncio.timeout(30):
                    for event in ready:
                        await event.wait()
                proxy.down = True
                went_down = time.monotonic()
                await proxy.cut()
                await asyncio.sleep(OUTAGE)
                proxy.down = False
                attempts = [t - went_down for t in proxy.opened if t > went_down + 1.0]
                async with await open_store(url) as writer:
                    await writer.put(MARK, b"1")
                async with asyncio.timeout(60):
                    await asyncio.gather(*tasks)
        finally:
            for store in stores:
                await store.aclose()
    assert len(attempts) >= CLIENTS, f"only {len(attempts)} attempts to reconnect were seen"
    most = busiest(attempts)
    assert most < LOCKSTEP, (
        f"{most} of {len(attempts)} attempts to reconnect fell within {WINDOW * 1000:.0f} ms: "
        f"the fleet retried in lockstep; attempts: {[round(a, 3) for a in sorted(attempts)]}"
    )
