"""The etcd backend beyond the shared contract: URLs, namespaces, leases, and faults.

Fault tests get an etcd of their own (``private_etcd``) that they stop, freeze or compact;
the rest share the session's etcd under a key prefix of their own.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable

import aetcd
import pytest

from dynamod.errors import ConfigError, StoreUnavailableError
from dynamod.store import KEEP, Resync, Store
from dynamod.store.etcd import EtcdStore, parse_url
from tests.support.servers import EtcdServer, free_port
from tests.support.storeload import RECOVERY, Follower, Writer
from tests.support.streams import next_event

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(120)]


class LogSeen(logging.Handler):
    """Sets ``seen`` once ``logger`` logs a message containing ``text``."""

    def __init__(self, logger: str, text: str) -> None:
        super().__init__()
        self.logger = logging.getLogger(logger)
        self.text = text
        self.seen = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()

    def __enter__(self) -> LogSeen:
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)


async def within_deadline(store: Store, call: Callable[[], Awaitable[object]]) -> object:
    """Run ``call`` under the deadline the contract gives every store call."""
    async with asyncio.timeout(store.timeout):
        return await call()


async def stop(server: EtcdServer) -> None:
    await asyncio.to_thread(server.stop)


async def start(server: EtcdServer) -> None:
    await asyncio.to_thread(server.start)


async def test_watch_resumes_where_it_was_after_etcd_restarts(private_etcd: EtcdServer) -> None:
    """etcd stops while a watch is open and a writer keeps writing, then starts again: the
    writes in between fail, and the watch goes on from the revision it had reached, with no
    Resync, no change twice and none missing: it ends at the true final state."""
    async with (
        await EtcdStore.open(private_etcd.url("ns")) as store,
        store.watch("w") as watch,
        asyncio.TaskGroup() as group,
    ):
        follower, writer = Follower(watch), Writer(store)
        group.create_task(follower.run())
        writing = group.create_task(writer.run())
        await writer.until(lambda: writer.accepted >= 20)
        await stop(private_etcd)
        await writer.until(lambda: writer.refused >= 3)
        await start(private_etcd)
        accepted = writer.accepted
        await writer.until(lambda: writer.accepted >= accepted + 20)
        writing.cancel()
        final, revision = await store.list("w")
        await follower.until(lambda: follower.seen >= revision)
        assert follower.resyncs == 1, "only the first Resync: the history was still there"
        assert follower.state == {e.key: e.value for e in final}
        after = await store.put("w/after", b"live")
        await follower.until(lambda: follower.seen >= after)
        assert follower.state["w/after"] == b"live"
        watch.close()  # ends the follower, so the task group can finish


async def test_calls_during_an_outage_fail_within_their_deadline(
    private_etcd: EtcdServer,
) -> None:
    async with await EtcdStore.open(private_etcd.url("ns")) as store:
        revision = await store.put("k", b"v")
        lease = await store.grant(30)
        await stop(private_etcd)
        calls: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("get 'k'", lambda: store.get("k")),
            ("put 'k'", lambda: store.put("k", b"w")),
            ("put 'k'", lambda: store.put("k", b"w", expect=revision)),
            ("delete 'k'", lambda: store.delete("k", expect=revision)),
            ("list ''", lambda: store.list("")),
            ("grant a lease", lambda: store.grant(5)),
            (f"refresh lease {lease.id:x}", lambda: store.refresh(lease)),
            (f"revoke lease {lease.id:x}", lambda: store.revoke(lease)),
        ]
        for what, call in calls:
            with pytest.raises(StoreUnavailableError, match=what):
                await within_deadline(store, call)
        with pytest.raises(StoreUnavailableError):
            async with asyncio.timeout(store.timeout), store.watch("k"):
                pytest.fail("a watch was established with etcd stopped")
        await start(private_etcd)


async def test_a_frozen_etcd_costs_a_call_its_deadline_not_a_hang(
    private_etcd: EtcdServer,
) -> None:
    """A server that accepts bytes and never answers (SIGSTOP) is the case deadlines are
    for: the call ends with StoreUnavailableError, and the store works once etcd thaws."""
    async with await EtcdStore.open(private_etcd.url("ns")) as store:
        store.timeout = 0.5
        await asyncio.to_thread(private_etcd.freeze)
        try:
            async with asyncio.timeout(10 * store.timeout):
                with pytest.raises(StoreUnavailableError, match="put 'k'"):
                    await store.put("k", b"v")
                with pytest.raises(StoreUnavailableError):
                    async with store.watch("k"):
                        pytest.fail("a watch was established with etcd frozen")
        finally:
            private_etcd.thaw()
        store.timeout = RECOVERY
        # The abandoned put's outcome is unknown: etcd may still apply it after the thaw,
        # in any order with later calls. So check recovery on another key.
        revision = await store.put("after-thaw", b"w")
        entry = await store.get("after-thaw")
        assert entry is not None and entry.revision == revision


async def test_watch_since_a_compacted_revision_starts_with_a_resync(
    private_etcd: EtcdServer,
) -> None:
    async with await EtcdStore.open(private_etcd.url("ns")) as store:
        first = await store.put("c/1", b"a")
        await store.put("c/1", b"b")
        last = await store.put("c/2", b"c")
        async with aetcd.Client("127.0.0.1", private_etcd.port) as client:
            await client.compact(last, physical=True)
        async with store.watch("c", since=first) as watch:
            event = await next_event(watch)
            assert isinstance(event, Resync)
            assert {e.key: e.value for e in event.entries} == {"c/1": b"b", "c/2": b"c"}
            revision = await store.put("c/3", b"d")
            event = await next_event(watch)
            assert (event.key, event.revision) == ("c/3", revision)  # type: ignore[union-attr]


async def test_closing_while_etcd_is_down_ends_the_watch_and_its_task(
    private_etcd: EtcdServer,
) -> None:
    store = await EtcdStore.open(private_etcd.url("ns"))
    retrying = LogSeen("dynamod.store.etcd", "cannot watch again")
    async with store.watch("w") as watch:
        assert isinstance(await next_event(watch), Resync)
        with retrying:
            await stop(private_etcd)
            async with asyncio.timeout(RECOVERY):
                await retrying.seen.wait()  # the feed is in its back-off loop now
        await store.aclose()
        assert [e async for e in watch] == []
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("etcd watch")]


async def test_a_dead_first_endpoint_is_skipped(etcd_server: EtcdServer) -> None:
    url = f"etcd://127.0.0.1:{free_port()},{etcd_server.endpoint}/t-{uuid.uuid4().hex[:12]}"
    async with await EtcdStore.open(url) as store:
        revision = await store.put("k", b"v")
        entry = await store.get("k")
        assert entry is not None and entry.revision == revision


async def test_no_live_endpoint_is_store_unavailable_naming_the_url() -> None:
    url = f"etcd://127.0.0.1:{free_port()},127.0.0.1:{free_port()}/x"
    with pytest.raises(StoreUnavailableError, match=url):
        await EtcdStore.open(url)


async def test_the_prefix_is_a_namespace(etcd_server: EtcdServer) -> None:
    """Store key ``a/b`` lives at etcd key ``<prefix>/a/b``; another prefix sees nothing,
    and keys outside the key grammar written there by others are not shown."""
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    async with (
        await EtcdStore.open(etcd_server.url(f"{prefix}/one")) as one,
        await EtcdStore.open(etcd_server.url(f"{prefix}/two")) as two,
        aetcd.Client("127.0.0.1", etcd_server.port) as raw,
    ):
        revision = await one.put("a/b", b"v")
        found = await raw.get(f"{prefix}/one/a/b".encode())
        assert found is not None and (found.value, found.mod_revision) == (b"v", revision)
        assert await two.get("a/b") is None
        assert (await two.list(""))[0] == []
        await raw.put(f"{prefix}/one/not a key".encode(), b"x")
        await raw.put(f"{prefix}/one-sibling/a/b".encode(), b"x")
        assert [e.key for e in (await one.list(""))[0]] == ["a/b"]


async def test_lease_ttl_is_what_etcd_granted(etcd_url: str) -> None:
    async with await EtcdStore.open(etcd_url) as store:
        lease = await store.grant(0.2)
        async with aetcd.Client(*parse_url(etcd_url).endpoints[0]) as raw:
            info = await raw.get_lease_info(lease.id, keys=False)
        assert lease.ttl == info.grantedTTL >= 1
        await store.revoke(lease)
        await store.revoke(lease)  # already gone: nothing to do


async def test_keep_on_a_missing_key_creates_it_without_a_lease(etcd_url: str) -> None:
    async with await EtcdStore.open(etcd_url) as store:
        lease = await store.grant(30)
        await store.put("k", b"v", lease=KEEP)
        await store.put("k", b"w", lease=KEEP)
        await store.revoke(lease)
        entry = await store.get("k")
        assert entry is not None and entry.value == b"w"


def test_urls_parse_into_endpoints_and_a_namespace() -> None:
    target = parse_url("etcd://a:1,[::1]:2,b/x/y/")
    assert (target.endpoints, target.root) == ((("a", 1), ("[::1]", 2), ("b", 2379)), "x/y/")
    target = parse_url("etcd://127.0.0.1:2379")
    assert (target.endpoints, target.root, target.tls, target.login) == (
        (("127.0.0.1", 2379),),
        "",
        None,
        None,
    )


@pytest.mark.parametrize(
    "url",
    [
        "etcd://",
        "etcd:///prefix",
        "etcd://host:0",
        "etcd://host:99999",
        "etcd://host:port",
        "etcd://a:1,,b:2",
        "etcd://host:1/a//b",
        "etcd://host:1/a b",
        "etcd://host:1/x?timeout=3",
        "etcd://[::1/x",
        "http://host:1",
    ],
)
def test_a_malformed_url_is_a_config_error_naming_it(url: str) -> None:
    with pytest.raises(ConfigError, match=f"URL '{url}'".replace("?", r"\?").replace("[", r"\[")):
        parse_url(url)
