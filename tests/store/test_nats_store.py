"""The NATS JetStream KV backend beyond the shared contract: URLs, key mapping, buckets,
leases across connections, compacted replays, and faults.

Every test that needs a server gets its own ``nats_server`` (it starts in tens of
milliseconds); fault tests stop, kill or freeze it and start it again on the same port and
data directory. Time bounds asserted here are the ones the contract or the backend promises:
a lease's ``Delete`` within TTL + 1 s, a failed call well before its deadline, a watch back
well before the ~14 s nats-py's own watcher takes after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import nats
import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import Client as NatsClient
from nats.js import api

from dynamod.errors import ConfigError, LeaseExpiredError, StoreUnavailableError
from dynamod.store import KEEP, Delete, Put, Resync, Watch, keep_alive
from dynamod.store.base import in_prefix
from dynamod.store.nats import (
    HEARTBEAT,
    MARKER_TTL,
    NatsStore,
    decode_key,
    encode_key,
    parse_url,
    subject_filters,
)
from tests.support.servers import NatsServer, free_port
from tests.support.streams import fold, next_event

pytestmark = [pytest.mark.nats, pytest.mark.timeout(60)]

FAST = 2.0  # "at once": far below the 30 s call deadline the fault tests set
PROMPT = 5.0  # a watch is back within this after the server is; nats-py's watcher took ~14 s
SLOW_CALLS = 30.0

T = TypeVar("T")


@contextlib.asynccontextmanager
async def opened(url: str, timeout: float = 5.0) -> AsyncIterator[NatsStore]:  # noqa: ASYNC109
    store = await NatsStore.open(url, timeout=timeout)
    try:
        yield store
    finally:
        await store.aclose()


async def follow(
    watch: Watch, state: dict[str, bytes], done: Callable[[], bool], within: float = 10.0
) -> None:
    """Fold events into ``state`` until ``done()``."""
    async with asyncio.timeout(within):
        while not done():
            fold(state, await anext(watch))


# -- URLs and keys ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "hosts", "bucket"),
    [
        ("nats://127.0.0.1:4300/workers", ("127.0.0.1:4300",), "workers"),
        ("nats://a,b:4223", ("a:4222", "b:4223"), "dynamo"),
        ("nats://a:1,b/x_y-z", ("a:1", "b:4222"), "x_y-z"),
        ("nats://[::1]:4222/b", ("[::1]:4222",), "b"),
    ],
)
def test_urls_name_servers_and_bucket(url: str, hosts: tuple[str, ...], bucket: str) -> None:
    target = parse_url(url)
    assert (target.hosts, target.bucket, target.shown) == (hosts, bucket, url)
    assert target.servers == [f"nats://{host}" for host in hosts]


def test_credentials_in_the_url_are_refused_without_repeating_them() -> None:
    with pytest.raises(ConfigError, match="password_file") as caught:
        parse_url("nats://alice:s3cret@a:1,b/x")
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("http://host:4222/b", "the form is nats://"),
        ("nats://host:4222/b?history=5", "unknown parameter .history."),
        ("nats://host:port/b", "server 'host:port'"),
        ("nats://host:0/b", "server 'host:0'"),
        ("nats://host:70000/b", "server 'host:70000'"),
        ("nats://a,,b/b", "server ''"),
        ("nats:///b", "server ''"),
        ("nats://host/bad.bucket", "bucket 'bad.bucket'"),
        ("nats://host/two/levels", "bucket 'two/levels'"),
    ],
)
async def test_malformed_urls_are_refused_before_connecting(url: str, complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint):
        await NatsStore.open(url)


segment = st.text("abcXYZ019._-", min_size=1, max_size=6).filter(lambda s: s not in (".", ".."))
store_key = st.lists(segment, min_size=1, max_size=4).map("/".join)


def nats_matches(subject: str, pattern: str) -> bool:
    """NATS subject matching for literal tokens and a trailing ``>``."""
    tokens, wanted = subject.split("."), pattern.split(".")
    if wanted[-1] == ">":
        return len(tokens) >= len(wanted) and tokens[: len(wanted) - 1] == wanted[:-1]
    return tokens == wanted


@given(store_key)
def test_key_mapping_is_reversible_and_gives_plain_tokens(key: str) -> None:
    token = encode_key(key)
    assert decode_key(token) == key
    assert all(part and part not in ("*", ">") for part in token.split("."))


@given(store_key, st.one_of(st.just(""), store_key))
def test_prefix_filters_match_exactly_the_keys_under_the_prefix(key: str, prefix: str) -> None:
    subject = "$KV.b." + encode_key(key)
    matched = any(nats_matches(subject, f) for f in subject_filters("$KV.b.", prefix))
    assert matched == in_prefix(key, prefix)


# -- connecting and buckets -------------------------------------------------------------------


async def test_an_unreachable_server_is_unavailable_within_the_timeout() -> None:
    before = asyncio.all_tasks()
    async with asyncio.timeout(1.0 + FAST):
        with pytest.raises(StoreUnavailableError, match=r"did not answer within 1\.0 s"):
            await NatsStore.open(f"nats://127.0.0.1:{free_port()}/b", timeout=1.0)
    assert asyncio.all_tasks() - before == set()


async def test_a_new_bucket_keeps_one_message_per_key_with_ttls_and_markers(
    nats_server: NatsServer,
) -> None:
    async with opened(nats_server.url("fresh")), raw_client(nats_server) as nc:
        config = (await nc.jetstream().stream_info("KV_fresh")).config
    assert config.max_msgs_per_subject == 1
    assert config.allow_msg_ttl
    assert config.subject_delete_marker_ttl == MARKER_TTL


async def test_a_bucket_without_ttls_gains_them_in_place(nats_server: NatsServer) -> None:
    async with raw_client(nats_server) as nc:
        await nc.jetstream().add_stream(
            api.StreamConfig(name="KV_old", subjects=["$KV.old.>"], max_msgs_per_subject=1)
        )
    async with opened(nats_server.url("old")) as store:
        lease = await store.grant(1)
        await store.put("k", b"v", lease=lease)
        async with store.watch("k") as watch:
            assert isinstance(await next_event(watch), Resync)
            gone = await next_event(watch, within=lease.ttl + 5)
    assert isinstance(gone, Delete) and gone.key == "k"


async def test_a_bucket_with_history_is_refused(nats_server: NatsServer) -> None:
    async with raw_client(nats_server) as nc:
        await nc.jetstream().create_key_value(api.KeyValueConfig(bucket="hist", history=5))
    with pytest.raises(ConfigError, match="'hist' keeps 5 revisions per key"):
        await NatsStore.open(nats_server.url("hist"))


@contextlib.asynccontextmanager
async def raw_client(server: NatsServer) -> AsyncIterator[NatsClient]:
    """A plain nats-py connection, for setting up buckets as another tool would."""
    nc = await nats.connect(f"nats://127.0.0.1:{server.port}")
    try:
        yield nc
    finally:
        await nc.close()


# -- leases across connections ----------------------------------------------------------------


async def test_an_abandoned_lease_ends_with_a_delete_within_ttl_plus_a_second(
    nats_server: NatsServer,
) -> None:
    """The owner refreshes for a while and then stops (its keep-alive is cancelled); an
    observer on another connection sees the refreshes as puts, then the expiry."""
    async with opened(nats_server.url()) as owner, opened(nats_server.url()) as observer:
        lease = await owner.grant(1)
        await owner.put("w/1", b"alive", lease=lease)
        async with observer.watch("w") as watch, asyncio.TaskGroup() as group:
            state: dict[str, bytes] = {}
            fold(state, await next_event(watch))
            refresher = group.create_task(keep_alive(owner, lease))
            refreshes = 0
            while refreshes < 4:  # the key outlives several TTLs while refreshed
                event = await next_event(watch, within=lease.ttl)
                assert isinstance(event, Put) and event.entry.value == b"alive"
                refreshes += 1
            refresher.cancel()
            last_refresh = time.monotonic()
            event = await next_event(watch, within=lease.ttl + 5)
            while isinstance(event, Put):  # a refresh already on its way when cancelled
                last_refresh = time.monotonic()
                event = await next_event(watch, within=lease.ttl + 5)
            waited = time.monotonic() - last_refresh
        assert isinstance(event, Delete) and event.key == "w/1"
        assert waited <= lease.ttl + 1.0, f"Delete came {waited:.2f} s after the last refresh"
        with pytest.raises(LeaseExpiredError):
            await owner.refresh(lease)


async def test_a_record_rewritten_with_keep_on_another_connection_still_expires(
    nats_server: NatsServer,
) -> None:
    async with opened(nats_server.url()) as owner, opened(nats_server.url()) as other:
        lease = await owner.grant(2)
        revision = await owner.put("w/1", b"v1", lease=lease)
        async with other.watch("w") as watch:
            assert isinstance(await next_event(watch), Resync)
            await other.put("w/1", b"v2", expect=revision, lease=KEEP)
            rewritten = await next_event(watch)
            started = time.monotonic()
            gone = await next_event(watch, within=lease.ttl + 5)
            waited = time.monotonic() - started
        assert isinstance(rewritten, Put) and rewritten.entry.value == b"v2"
        assert isinstance(gone, Delete) and gone.key == "w/1"
        assert waited <= lease.ttl + 1.0, f"Delete came {waited:.2f} s after the rewrite"


async def test_refresh_keeps_a_value_another_connection_wrote(nats_server: NatsServer) -> None:
    """A taint update by another process changes the record between two refreshes: the
    owner's refresh re-publishes the new value, and a rewrite without the lease unbinds."""
    async with opened(nats_server.url()) as owner, opened(nats_server.url()) as other:
        lease = await owner.grant(30)
        revision = await owner.put("w/1", b"v1", lease=lease)
        rewritten = await other.put("w/1", b"v2", expect=revision, lease=KEEP)
        await owner.refresh(lease)
        entry = await other.get("w/1")
        assert entry is not None and entry.value == b"v2" and entry.revision > rewritten
        unbound = await other.put("w/1", b"v3", expect=entry.revision)
        await owner.refresh(lease)
        await owner.revoke(lease)
        entry = await other.get("w/1")
        assert entry is not None and (entry.value, entry.revision) == (b"v3", unbound)


async def test_a_lease_whose_key_was_deleted_elsewhere_has_expired(
    nats_server: NatsServer,
) -> None:
    async with opened(nats_server.url()) as owner, opened(nats_server.url()) as other:
        lease = await owner.grant(30)
        await owner.put("w/1", b"x", lease=lease)
        await owner.put("w/2", b"y", lease=lease)
        await other.delete("w/1")
        with pytest.raises(LeaseExpiredError, match="'w/1' is gone"):
            await owner.refresh(lease)
        assert await other.get("w/2") is None  # the lease ended as a whole
        with pytest.raises(LeaseExpiredError):
            await owner.put("w/3", b"z", lease=lease)


# -- compacted replay -------------------------------------------------------------------------


async def test_a_replay_since_a_revision_includes_a_later_expiry(nats_server: NatsServer) -> None:
    async with opened(nats_server.url()) as store:
        lease = await store.grant(1)
        revision = await store.put("w/1", b"x", lease=lease)
        await store.put("w/2", b"y")
        async with store.watch("w/1") as watch:
            assert isinstance(await next_event(watch), Resync)
            assert isinstance(await next_event(watch, within=lease.ttl + 5), Delete)
        async with store.watch("w", since=revision) as watch:
            put, delete = await next_event(watch), await next_event(watch)
    assert isinstance(put, Put) and put.key == "w/2"
    assert isinstance(delete, Delete) and delete.key == "w/1"


async def test_a_replay_older_than_the_markers_starts_with_a_resync(
    nats_server: NatsServer,
) -> None:
    """Expiry markers vanish after the bucket's marker TTL (1 s here); a replay across a
    vanished marker would silently keep an expired key, so the watch resyncs instead."""
    async with raw_client(nats_server) as nc:
        config = api.KeyValueConfig(bucket="short", history=1, limit_marker_ttl=1)
        await nc.jetstream().create_key_value(config)
    async with opened(nats_server.url("short")) as store:
        lease = await store.grant(1)
        revision = await store.put("w/1", b"x", lease=lease)
        async with store.watch("w") as watch:
            assert isinstance(await next_event(watch), Resync)
            assert isinstance(await next_event(watch, within=lease.ttl + 5), Delete)
        await asyncio.sleep(1.5)  # let the marker age past its TTL: the scenario, not a poll
        async with store.watch("w", since=revision) as watch:
            first = await next_event(watch)
    assert isinstance(first, Resync) and first.entries == ()


# -- scale ------------------------------------------------------------------------------------


async def test_list_reads_thousands_of_keys_in_one_pass(nats_server: NatsServer) -> None:
    async with opened(nats_server.url()) as store:
        for chunk in range(20):
            await asyncio.gather(*(store.put(f"many/{chunk}/{i}", b"%d" % i) for i in range(100)))
        await store.put("many-not/1", b"outside")
        entries, revision = await store.list("many")
        first, _ = await store.list("many/1")
    assert len(entries) == 2000
    assert revision >= max(e.revision for e in entries)
    assert [e.key for e in entries] == sorted(e.key for e in entries)
    assert {e.key.split("/")[1] for e in first} == {"1"}


# -- faults -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kill", [False, True], ids=["stopped", "killed"])
async def test_a_watch_resyncs_promptly_after_a_restart_and_ends_at_the_truth(
    nats_server: NatsServer, kill: bool
) -> None:
    """Writes fail while the server is down; writes made after it is back, before the
    watcher reconnected, are covered by the ``Resync`` that follows the reconnect."""
    async with opened(nats_server.url(), SLOW_CALLS) as watcher, watcher.watch("w") as watch:
        state: dict[str, bytes] = {}
        fold(state, await next_event(watch))
        await watcher.put("w/before", b"1")
        await watcher.put("w/gone", b"2")
        await follow(watch, state, lambda: len(state) == 2)
        await asyncio.to_thread(nats_server.stop, kill=kill)
        async with asyncio.timeout(FAST):
            with pytest.raises(StoreUnavailableError):
                await watcher.put("w/during", b"3")
        await asyncio.to_thread(nats_server.start)
        back = time.monotonic()
        async with opened(nats_server.url()) as writer:
            await writer.put("w/after", b"4")
            await writer.delete("w/gone")
            truth, _ = await writer.list("w")
        first = await next_event(watch, within=PROMPT)
        fold(state, first)
        resynced = time.monotonic() - back
        await follow(watch, state, lambda: state == {e.key: e.value for e in truth})
    assert isinstance(first, Resync), f"the first event after the restart was {first}"
    assert resynced <= PROMPT


async def test_a_watch_whose_consumer_was_deleted_recovers(nats_server: NatsServer) -> None:
    """An operator removes the watch's consumer (the connection stays up): the server's
    notice or the missing heartbeats make the watch re-establish it and resync."""
    async with opened(nats_server.url()) as store, store.watch("w") as watch:
        assert isinstance(await next_event(watch), Resync)
        async with raw_client(nats_server) as nc:
            js = nc.jetstream()
            for consumer in await js.consumers_info("KV_dynamo"):
                await js.delete_consumer("KV_dynamo", consumer.name)
            await js.publish("$KV.dynamo.w.k", b"written meanwhile")
        event = await next_event(watch, within=2.5 * HEARTBEAT + PROMPT)
    assert isinstance(event, Resync)
    assert [(e.key, e.value) for e in event.entries] == [("w/k", b"written meanwhile")]


async def test_calls_fail_at_once_while_the_server_is_down(nats_server: NatsServer) -> None:
    async with opened(nats_server.url(), SLOW_CALLS) as store:
        lease = await store.grant(30)
        await store.put("k", b"v", lease=lease)
        await asyncio.to_thread(nats_server.stop)
        async with asyncio.timeout(FAST):
            calls: list[Callable[[], Awaitable[Any]]] = [
                lambda: store.put("k", b"w"),
                lambda: store.put("k", b"w", expect=1),
                lambda: store.get("k"),
                lambda: store.delete("k"),
                lambda: store.list(""),
                lambda: store.refresh(lease),
            ]
            for call in calls:
                with pytest.raises(StoreUnavailableError, match="not connected"):
                    await call()
        await asyncio.to_thread(nats_server.start)
        revision = await until_connected(lambda: store.put("k", b"again"))
        entry = await store.get("k")
        assert entry is not None and (entry.value, entry.revision) == (b"again", revision)


async def test_a_call_in_flight_fails_as_soon_as_the_connection_drops(
    nats_server: NatsServer,
) -> None:
    """The server is frozen, so a put hangs; killing it ends the put long before its deadline."""
    async with opened(nats_server.url(), SLOW_CALLS) as store:
        await store.put("k", b"v")
        await freeze(nats_server)
        try:
            hanging = asyncio.create_task(store.put("k", b"w"))
            done, _ = await asyncio.wait({hanging}, timeout=0.2)
            assert not done, "a put to a frozen server should not have finished"
        finally:
            await asyncio.to_thread(nats_server.stop, kill=True)
        async with asyncio.timeout(FAST):
            with pytest.raises(StoreUnavailableError, match="lost its NATS connection"):
                await hanging


async def test_a_frozen_server_fails_a_call_at_its_deadline(nats_server: NatsServer) -> None:
    async with opened(nats_server.url(), timeout=1.0) as store:
        proc = await freeze(nats_server)
        try:
            async with asyncio.timeout(1.0 + FAST):
                with pytest.raises(
                    StoreUnavailableError, match=r"did not answer put within 1\.0 s"
                ):
                    await store.put("k", b"v")
        finally:
            proc.send_signal(signal.SIGCONT)
        assert await store.put("k", b"w") > 0


async def freeze(server: NatsServer) -> subprocess.Popen[bytes]:
    """Stop the server process (SIGSTOP) and return once the kernel says it is stopped."""
    await asyncio.to_thread(server.freeze)
    assert server.proc is not None
    return server.proc


async def test_close_leaves_no_task_behind(nats_server: NatsServer) -> None:
    before = asyncio.all_tasks()
    store = await NatsStore.open(nats_server.url())
    async with store.watch("w") as watch:
        assert isinstance(await next_event(watch), Resync)
        await store.put("w/1", b"x")
        await store.list("")
        await store.aclose()
        assert [e async for e in watch] == []
    assert asyncio.all_tasks() - before == set()


async def until_connected(call: Callable[[], Awaitable[T]], within: float = PROMPT) -> T:
    """Retry ``call`` while the store is reconnecting (bounded by ``within``)."""
    async with asyncio.timeout(within):
        while True:
            try:
                return await call()
            except StoreUnavailableError:
                await asyncio.sleep(0.05)  # pacing retries of a real call, not polling a flag
