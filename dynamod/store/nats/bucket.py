"""The KV bucket's JetStream stream: made ready when the store connects, then read from and
appended to by compare-and-swap.

Every method raises nats-py's errors; the store's call wrapper turns them into ours.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Mapping
from typing import Final

import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from dynamod.errors import ConfigError, ConflictError
from dynamod.store.base import Delete, Entry, Put, validate_key
from dynamod.store.nats.keys import decode_key, encode_key
from dynamod.store.nats.messages import EXPECT, LastMessage, is_tombstone

log = logging.getLogger(__name__)

MARKER_TTL: Final = 900
"""Seconds a server expiry marker stays in a bucket this store creates."""
CAS_ROUNDS: Final = 16
"""Compare-and-swap rounds of one call before it gives up with ``ConflictError``."""

_WRONG_LAST: Final = frozenset({10071, 10164})
_NO_MESSAGE: Final = 10037
_STREAM_IN_USE: Final = 10058


class Bucket:
    """The stream ``KV_<name>`` that backs bucket ``name``, and its subjects."""

    def __init__(
        self, nc: Client, js: JetStreamContext, name: str, replicas: int | None = None
    ) -> None:
        self.name = name
        self.replicas = replicas
        self.stream = f"KV_{name}"
        self.root = f"$KV.{name}."
        self.marker_ttl: float = MARKER_TTL
        self._nc = nc
        self._js = js

    def subject(self, key: str) -> str:
        """The subject of ``key``; ``InvalidKeyError`` for a key outside the grammar."""
        return self.root + encode_key(validate_key(key))

    def event(self, msg: Msg) -> Put | Delete:
        """The change a message delivered by a consumer on this stream stands for."""
        key = decode_key(msg.subject[len(self.root) :])
        seq = msg.metadata.sequence.stream
        if is_tombstone(msg.headers or {}):
            return Delete(key, seq)
        return Put(Entry(key, msg.data or b"", seq))

    # -- made ready -----------------------------------------------------------------------

    async def ensure(self) -> None:
        """Create the bucket or adapt an existing one; learn its marker TTL."""
        try:
            info = await self._js.stream_info(self.stream)
        except nats.js.errors.NotFoundError:
            info = await self._create()
        config = info.config
        if config.max_msgs_per_subject != 1:
            raise ConfigError(
                f"NATS bucket {self.name!r} keeps {config.max_msgs_per_subject} "
                "revisions per key; dynamod needs history 1, because an expiring key would "
                "otherwise reveal its older value. Use another bucket name, or recreate it"
            )
        if not config.allow_msg_ttl or not config.subject_delete_marker_ttl:
            config = dataclasses.replace(
                config,
                allow_msg_ttl=True,
                subject_delete_marker_ttl=config.subject_delete_marker_ttl or MARKER_TTL,
            )
            await self._upgrade(config)
            log.info("enabled per-key TTL and expiry markers on bucket %r", self.name)
        if self.replicas is not None and config.num_replicas != self.replicas:
            await self._rescale(config)
        self.marker_ttl = config.subject_delete_marker_ttl or MARKER_TTL

    async def _upgrade(self, config: api.StreamConfig) -> None:
        try:
            await self._js.update_stream(config)
        except nats.js.errors.APIError as exc:
            raise ConfigError(
                f"NATS bucket {self.name!r} has no per-key TTL or expiry markers, "
                f"and enabling them failed: {exc.description}; recreate it with a TTL-capable "
                "nats-server (2.11 or newer)"
            ) from None

    async def _rescale(self, config: api.StreamConfig) -> None:
        """The URL asks for another replica count than the bucket has: JetStream moves the
        stream to that many servers in place."""
        try:
            await self._js.update_stream(dataclasses.replace(config, num_replicas=self.replicas))
        except nats.js.errors.APIError as exc:
            raise ConfigError(
                f"NATS bucket {self.name!r} has {config.num_replicas} replicas and the URL "
                f"asks for {self.replicas}, but changing them failed: {exc.description}"
            ) from None
        log.info(
            "bucket %r now has %d replicas (was %d)", self.name, self.replicas, config.num_replicas
        )

    async def _create(self) -> api.StreamInfo:
        config = api.KeyValueConfig(
            bucket=self.name,
            history=1,
            limit_marker_ttl=MARKER_TTL,
            replicas=self.replicas or 1,
        )
        try:
            await self._js.create_key_value(config)
        except nats.js.errors.KeyValueLimitMarkerTTLNotSupportedError:
            version = self._nc.connected_server_version
            raise ConfigError(
                f"NATS server {version} at {self._nc.connected_url} has no per-key TTL; "
                "dynamod needs nats-server 2.11 or newer"
            ) from None
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != _STREAM_IN_USE:  # another process created it first
                raise
        return await self._js.stream_info(self.stream)

    # -- reads and writes -----------------------------------------------------------------

    async def last_seq(self) -> int:
        """The stream's last sequence: the store revision now."""
        return (await self._js.stream_info(self.stream)).state.last_seq

    async def read(self, subject: str) -> LastMessage | None:
        """The last message on ``subject``, tombstones included; ``None`` if there is none."""
        try:
            raw = await self._js.get_msg(self.stream, subject=subject)
        except nats.js.errors.NotFoundError as exc:
            if exc.err_code != _NO_MESSAGE:
                raise
            return None
        assert raw.seq is not None
        return LastMessage(raw.seq, raw.data or b"", raw.headers or {})

    async def publish(
        self, subject: str, value: bytes, headers: Mapping[str, str], *, last: int | None
    ) -> int | None:
        """Append a message; with ``last``, only while the subject is at that sequence.

        Returns the new sequence, or ``None`` when the subject had moved on.
        """
        sent = dict(headers)
        if last is not None:
            sent[EXPECT] = str(last)
        try:
            ack = await self._js.publish(subject, value, headers=sent or None)
        except nats.js.errors.APIError as exc:
            if exc.err_code in _WRONG_LAST:
                return None
            raise
        return ack.seq

    # -- history --------------------------------------------------------------------------

    async def replay_is_complete(self, since: int) -> bool:
        """Whether the stream still holds every change after ``since``, compacted.

        Values and delete tombstones stay until overwritten; only expiry markers vanish,
        ``marker TTL`` after they were written. A time at or before the first change after
        ``since`` that is younger than half that TTL proves none has vanished yet.
        """
        state = (await self._js.stream_info(self.stream)).state
        if since >= state.last_seq:
            return True
        when = await self._message_time(since) if since > 0 else None
        if when is None and state.first_seq <= since + 1:
            when = await self._message_time(state.first_seq)
        if when is None:
            return False
        age = datetime.datetime.now(datetime.UTC) - when
        return age.total_seconds() < self.marker_ttl / 2

    async def _message_time(self, seq: int) -> datetime.datetime | None:
        try:
            return (await self._js.get_msg(self.stream, seq=seq)).time
        except nats.js.errors.NotFoundError:
            return None


def conflict(what: str, key: str) -> ConflictError:
    """The error of a call that lost every compare-and-swap round to other writers."""
    return ConflictError(
        f"{what} of {key!r} lost {CAS_ROUNDS} compare-and-swap rounds to other writers; retry"
    )
