"""A worker's subscriber to vLLM's KV-event publisher (``worker/engines/vllm_events.py``)
over real ZMQ sockets on loopback: the test plays vLLM's publisher (a PUB socket and the
ROUTER replay socket, with vLLM's recorded messages) and checks what reaches the
worker's ``KvPublisher`` when messages were published before it connected, when one is
lost, when there is no replay socket to fill the gap, and when the engine restarts."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
import zmq
import zmq.asyncio

from dynamod.kv_events import AllBlocksCleared, KvBatch, KvEvent
from dynamod.tasks import cancel_and_wait
from dynamod.worker.engines.kvevents import KvPublisher, KvSubscription
from dynamod.worker.engines.vllm_events import END_SEQ, MAX_MESSAGE, VllmSubscriber, decode

DATA = Path(__file__).resolve().parent.parent / "data" / "kv_events"
PAYLOADS = [
    msgspec.msgpack.decode((DATA / f"kinds_{n:03d}.bin").read_bytes())[2] for n in (0, 1, 6, 21)
]
"""Four recorded payloads: a 9-block prompt, a decode block, removal + store, a clear."""


class FakeVllm:
    """vLLM's publisher: every message it sends is kept for replay, as vLLM keeps them."""

    def __init__(self, context: zmq.asyncio.Context, *, replay: bool) -> None:
        self.pub = context.socket(zmq.XPUB)  # a PUB that also tells when a SUB joined
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.router = context.socket(zmq.ROUTER) if replay else None
        self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1") if self.router else 0
        self.sent: list[tuple[int, bytes]] = []
        self.replays: list[int] = []
        self.answer: asyncio.Event | None = None
        """Set: replay requests wait for it (so messages sent meanwhile are replayed too)."""

    @property
    def endpoints(self) -> tuple[str, str | None]:
        replay = f"tcp://127.0.0.1:{self.replay_port}" if self.router else None
        return f"tcp://127.0.0.1:{self.port}", replay

    async def joined(self) -> None:
        assert (await self.pub.recv())[0] == 1, "a subscription message"

    async def send(self, seq: int, payload: bytes, *, lost: bool = False) -> None:
        self.sent.append((seq, payload))
        if not lost:
            await self.pub.send_multipart([b"kv@test", seq.to_bytes(8, "big"), payload])

    async def serve_replays(self) -> None:
        assert self.router is not None
        while True:
            client, _, start = await self.router.recv_multipart()
            if self.answer is not None:
                await self.answer.wait()
            first = int.from_bytes(start, "big")
            self.replays.append(first)
            for seq, payload in self.sent:
                if seq >= first:
                    frames = [client, b"", b"kv@test", seq.to_bytes(8, "big"), payload]
                    await self.router.send_multipart(frames)
            await self.router.send_multipart(
                [client, b"", b"", END_SEQ.to_bytes(8, "big", signed=True), b""]
            )

    def close(self) -> None:
        self.pub.close(linger=0)
        if self.router is not None:
            self.router.close(linger=0)


@contextlib.asynccontextmanager
async def following(
    fake: FakeVllm, publisher: KvPublisher, *, catch_up: bool = True
) -> AsyncIterator[VllmSubscriber]:
    endpoint, replay = fake.endpoints
    subscriber = VllmSubscriber(endpoint, publisher, replay=replay, catch_up=catch_up)
    tasks = [asyncio.create_task(subscriber.run())]
    if fake.router is not None:
        tasks.append(asyncio.create_task(fake.serve_replays()))
    try:
        await asyncio.wait_for(fake.joined(), 10)
        yield subscriber
    finally:
        for task in tasks:
            await cancel_and_wait(task)


@contextlib.asynccontextmanager
async def watched(
    context: zmq.asyncio.Context, *, replay: bool
) -> AsyncIterator[tuple[FakeVllm, KvPublisher, KvSubscription]]:
    """A fake vLLM, and the worker's publisher with one subscriber past its (empty)
    snapshot, as a daemon's stream would be."""
    fake = FakeVllm(context, replay=replay)
    publisher = KvPublisher()
    try:
        with publisher.subscribe() as subscription:
            await events_until(subscription, 1)  # the (empty) snapshot
            yield fake, publisher, subscription
    finally:
        fake.close()


async def events_until(subscription: KvSubscription, count: int) -> list[KvEvent]:
    """The events the worker forwards, until ``count`` batches came (10 s at most)."""
    seen: list[KvBatch] = []
    async with asyncio.timeout(10):
        while len(seen) < count:
            await subscription.wait()
            seen.extend(subscription.take())
    return [e for batch in seen for e in batch.events]


def recorded(*indexes: int) -> list[KvEvent]:
    return [e for i in indexes for e in decode([b"", b"\0" * 8, PAYLOADS[i]])[1].events]


@pytest.fixture
async def context() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.term()


async def test_a_late_subscriber_replays_what_was_published_before_it_connected(
    context: zmq.asyncio.Context,
) -> None:
    async with watched(context, replay=True) as (fake, publisher, subscription):
        await fake.send(0, PAYLOADS[0], lost=True)  # nobody was listening yet
        async with following(fake, publisher):
            await fake.send(1, PAYLOADS[1])
            assert await events_until(subscription, 2) == recorded(0, 1)
            assert fake.replays == [0]


async def test_a_live_batch_the_replay_already_gave_is_no_restart(
    context: zmq.asyncio.Context,
) -> None:
    """The catch-up replay is answered after a live message went out: the replay carries
    it, and its live copy, read next, is the same batch (not an engine starting over)."""
    async with watched(context, replay=True) as (fake, publisher, subscription):
        fake.answer = asyncio.Event()
        await fake.send(0, PAYLOADS[0], lost=True)
        async with following(fake, publisher) as subscriber:
            await fake.send(1, PAYLOADS[1])  # queued live while the replay waits
            fake.answer.set()
            assert await events_until(subscription, 2) == recorded(0, 1)
            await fake.send(2, PAYLOADS[2])
            assert await events_until(subscription, 1) == recorded(2)
            assert subscriber.gaps == 0 and fake.replays == [0]


async def test_a_lost_message_is_replayed_in_order(context: zmq.asyncio.Context) -> None:
    async with (
        watched(context, replay=True) as (fake, publisher, subscription),
        following(fake, publisher, catch_up=False) as subscriber,
    ):
        await fake.send(0, PAYLOADS[0])
        await fake.send(1, PAYLOADS[1], lost=True)
        await fake.send(2, PAYLOADS[2])
        assert await events_until(subscription, 3) == recorded(0, 1, 2)
        assert fake.replays == [1] and subscriber.gaps == 0


async def test_without_a_replay_socket_a_gap_clears_and_rebuilds(
    context: zmq.asyncio.Context,
) -> None:
    async with (
        watched(context, replay=False) as (fake, publisher, subscription),
        following(fake, publisher) as subscriber,
    ):
        await fake.send(0, PAYLOADS[0])
        await fake.send(1, PAYLOADS[1], lost=True)
        await fake.send(2, PAYLOADS[2])
        events = await events_until(subscription, 3)
        assert events == [*recorded(0), AllBlocksCleared(), *recorded(2)]
        assert subscriber.gaps == 1
        assert len(publisher) == 9, "the 9 blocks stored after the clear"


async def test_a_sequence_that_starts_over_is_an_engine_restart(
    context: zmq.asyncio.Context,
) -> None:
    async with (
        watched(context, replay=False) as (fake, publisher, subscription),
        following(fake, publisher),
    ):
        await fake.send(0, PAYLOADS[0])
        await fake.send(1, PAYLOADS[1])
        await fake.send(0, PAYLOADS[0])  # the restarted engine's first message
        events = await events_until(subscription, 4)
        assert events == [*recorded(0, 1), AllBlocksCleared(), *recorded(0)]
        assert len(publisher) == 9


async def test_a_malformed_stored_event_is_cleared_in_its_place_and_the_subscriber_lives_on(
    context: zmq.asyncio.Context, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``BlockStored`` with string token ids (it once ended the subscriber silently, and
    the index went stale): one log line, a clear where it stood, and the next batch
    follows."""
    bad = {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None,
           "token_ids": ["a"] * 64, "block_size": 32}  # fmt: skip
    async with (
        watched(context, replay=False) as (fake, publisher, subscription),
        following(fake, publisher) as subscriber,
    ):
        await fake.send(0, PAYLOADS[0])
        await fake.send(1, msgspec.msgpack.encode([1.7e9, [bad], 0]))
        await fake.send(2, PAYLOADS[2])
        events = await events_until(subscription, 3)
        assert events == [*recorded(0), AllBlocksCleared(), *recorded(2)]
        assert subscriber.gaps == 0
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1 and "token_ids must be integers" in refused[0].getMessage()


async def test_a_message_over_the_size_limit_is_not_taken_and_its_gap_is_cleared(
    context: zmq.asyncio.Context,
) -> None:
    """ZMQ refuses a message over ``MAX_MESSAGE`` bytes by dropping the connection for
    good: the subscriber clears (that batch is lost), connects again and goes on."""
    async with (
        watched(context, replay=False) as (fake, publisher, subscription),
        following(fake, publisher) as subscriber,
    ):
        await fake.send(0, PAYLOADS[0])
        assert await events_until(subscription, 1) == recorded(0)
        await fake.send(1, b"\x00" * (MAX_MESSAGE + 1))
        async with asyncio.timeout(10):
            while (await fake.pub.recv())[0] != 1:
                pass  # its unsubscription as it was dropped, then its subscription again
        await fake.send(2, PAYLOADS[2])
        assert await events_until(subscription, 2) == [AllBlocksCleared(), *recorded(2)]
        assert subscriber.gaps == 0
