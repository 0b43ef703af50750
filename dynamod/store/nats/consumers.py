"""The ordered push consumers on the bucket's stream: one behind each ``list``, one behind
each watch (see "Watches" in the package docstring).

A consumer delivers to a fresh inbox subscription with no acks, in memory. A gap in its
consumer sequence, a server status other than a heartbeat, a missed heartbeat or a change
of the connection breaks it; the store then makes a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api

from dynamod.store.base import WATCH_QUEUE
from dynamod.store.nats.bucket import Bucket
from dynamod.store.nats.keys import subject_filters

log = logging.getLogger(__name__)

HEARTBEAT: Final = 2.0
"""Idle heartbeat of a watch consumer; two missed ones mean the consumer is gone."""
INACTIVE: Final = 30.0
"""The server removes a consumer nobody listens to after this long (a crashed client)."""
CLEANUP_TIMEOUT: Final = 1.0


@dataclass(eq=False)
class Consumer:
    """One push consumer and the local subscription it delivers to.

    The subscription's callback queues messages; connection changes queue a reason string,
    so the task reading the queue sees data and trouble in one order.
    """

    sub: Subscription
    inbox: asyncio.Queue[Msg | str]
    name: str = ""
    pending: int = 0
    delivered: int = 0

    def signal(self, reason: str) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self.inbox.put_nowait(reason)

    async def next_data(self, *, within: float | None = None) -> Msg | str:
        """The next data message, or why the consumer broke; ``within`` is how long to wait
        for any message, a heartbeat included (``None``: forever)."""
        while True:
            try:
                async with asyncio.timeout(within):
                    item = await self.inbox.get()
            except TimeoutError:
                return "no heartbeat from the server"
            if isinstance(item, str):
                return item
            problem = self._sequence_problem(item)
            if problem:
                return problem
            if not _status(item):
                return item

    def _sequence_problem(self, msg: Msg) -> str:
        """Check the consumer sequence of a data message or a heartbeat; describe a gap."""
        status = _status(msg)
        if status and status != "100":
            return f"the server ended the consumer ({status} {msg.headers})"
        if status:
            claimed = (msg.headers or {}).get("Nats-Last-Consumer")
            if claimed is not None and int(claimed) != self.delivered:
                return f"messages were lost (server delivered {claimed}, {self.delivered} arrived)"
            return ""
        seq = msg.metadata.sequence.consumer
        if seq != self.delivered + 1:
            return f"messages were lost (consumer sequence {seq} after {self.delivered})"
        self.delivered = seq
        return ""


def _status(msg: Msg) -> str:
    """The status of a control message (``100`` for a heartbeat), ``""`` for data."""
    return (msg.headers or {}).get("Status", "")


class Consumers:
    """Makes and removes one store's consumers, and tracks the open ones so that news of the
    connection reaches each. ``reachable`` says whether the server can be asked to remove
    one now."""

    def __init__(
        self, nc: Client, js: JetStreamContext, bucket: Bucket, reachable: Callable[[], bool]
    ) -> None:
        self._nc = nc
        self._js = js
        self._bucket = bucket
        self._reachable = reachable
        self._open: set[Consumer] = set()

    def config(
        self, prefix: str, policy: api.DeliverPolicy, start: int | None = None
    ) -> api.ConsumerConfig:
        return api.ConsumerConfig(
            deliver_policy=policy,
            opt_start_seq=start,
            filter_subjects=subject_filters(self._bucket.root, prefix),
            ack_policy=api.AckPolicy.NONE,
            max_deliver=1,
            mem_storage=True,
            num_replicas=1,
            inactive_threshold=INACTIVE,
        )

    def watch_config(self, prefix: str, start: int | None) -> api.ConsumerConfig:
        if start is None:
            config = self.config(prefix, api.DeliverPolicy.NEW)
        else:
            config = self.config(prefix, api.DeliverPolicy.BY_START_SEQUENCE, start)
        config.idle_heartbeat = HEARTBEAT
        return config

    async def open(self, config: api.ConsumerConfig, *, bounded: bool = True) -> Consumer:
        """Subscribe to a fresh inbox, then create the consumer that delivers to it.

        A bounded inbox (watches) drops what does not fit, and the consumer-sequence check
        turns the drop into a re-established consumer; a list reads everything it asked for.
        """
        inbox: asyncio.Queue[Msg | str] = asyncio.Queue(WATCH_QUEUE if bounded else 0)

        async def deliver(msg: Msg) -> None:
            with contextlib.suppress(asyncio.QueueFull):
                inbox.put_nowait(msg)

        sub = await self._nc.subscribe(self._nc.new_inbox(), cb=deliver)
        consumer = Consumer(sub, inbox)
        self._open.add(consumer)
        try:
            config.deliver_subject = sub.subject
            info = await self._js.add_consumer(self._bucket.stream, config)
        except BaseException:
            await self.forget(consumer)
            raise
        consumer.name, consumer.pending = info.name, info.num_pending or 0
        return consumer

    async def forget(self, consumer: Consumer) -> None:
        """Drop a consumer: always the local subscription, the consumer on the server when we
        can reach it (otherwise the server removes it after ``INACTIVE``)."""
        self._open.discard(consumer)
        reachable = self._reachable()
        try:
            await consumer.sub.unsubscribe()
            if consumer.name and reachable:
                async with asyncio.timeout(CLEANUP_TIMEOUT):
                    await self._js.delete_consumer(self._bucket.stream, consumer.name)
        except (nats.errors.Error, TimeoutError) as exc:
            log.debug("consumer %s not removed cleanly: %s", consumer.name, exc)

    def signal(self, reason: str) -> None:
        """Tell every open consumer's reader about a change of the connection."""
        for consumer in self._open:
            consumer.signal(reason)
