"""Pool demand: what every daemon's router holds for the elastic pools, shared in the store.

An elastic policy's pools follow their demand (``elastic.py``): a pool's requests in flight
plus the requests routers hold waiting for a worker of it. The leader alone moves workers,
but requests reach every daemon, so each daemon publishes its own share, and the leader
(every daemon, for ``status``) adds them up.

The record
    While any stored policy is elastic, every daemon writes ``v1/pool-demand/<replica id>``
    every ``DEMAND_EVERY`` seconds when it changed (a lease refresh otherwise), bound to a
    lease of ``DEMAND_TTL`` seconds, so a daemon that dies stops counting within that TTL.
    It holds two things: ``in_flight``, the requests this daemon's router has in flight on
    each worker (those that are not zero), and ``waiting``, the requests waiting in its
    queue by the taints they require. The leader reads its own figures directly and the
    others' from the pool view's watch of the prefix (``PolicyView.demand``), so a
    follower's waiting requests reach the leader within ``DEMAND_EVERY`` plus the store's
    watch delay (milliseconds on loopback): about half a second.

Counting a worker's in flight (``Demand.in_flight``)
    An engine that reports its own load (``running`` plus ``waiting``: vLLM's metrics, the
    mocker, a worker's proxy count) counts every request on it, whichever daemon routed
    it, so its figure is the worker's in flight alone. Without one (a Dynamo worker's
    reach check), the routers' own counts are added: this daemon's and every other's.

Counting a pool's waiting requests (``Demand.waiting``)
    A request waiting in any router's queue counts for every pool taint it requires (a
    request needing ``pool=premium`` is premium demand; one requiring no pool taint is
    nobody's), whatever its model.

Bounds: a record is input from another process: one over ``MAX_REPORT_BYTES`` or that does
not decode as written is ignored, logged once per daemon, and the daemon's share counts
nothing until a good one comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from dynamod import jsoncodec
from dynamod.errors import LeaseExpiredError, StoreError
from dynamod.store import Entry, Lease, Store

log = logging.getLogger(__name__)

DEMAND_PREFIX: Final = "v1/pool-demand"
DEMAND_EVERY: Final = 0.5
"""Seconds between two looks at this daemon's demand (and writes, when it changed); also
how often the leader plans an elastic policy without a change: a surge is met within it
(``bench.elastic`` made its first moves 0.9 s into the step at 1 s). Each such plan reads
every worker the policy owns, so a very large elastic policy costs its leader (and every
follower, for its gauges) one plan per interval."""
DEMAND_TTL: Final = 10.0
"""Seconds a daemon's record outlives it."""
MAX_REPORT_BYTES: Final = 1024 * 1024
"""A record of more bytes is ignored (10,000 busy workers take about 400 KB)."""
_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class DemandReport:
    """One daemon's share: worker key -> requests in flight (non-zero only), and the
    requests waiting in its queue by the taints they require (sorted)."""

    daemon: str
    in_flight: Mapping[str, int] = field(default_factory=dict, hash=False)
    waiting: Mapping[tuple[str, ...], int] = field(default_factory=dict, hash=False)


def demand_key(daemon: str) -> str:
    """The daemon's record key. A replica id is any printable word, a key segment only
    ``[A-Za-z0-9._-]``: an id with other characters is written with them as ``_`` and a
    hash of the whole id after it, so two ids never share a key."""
    if _SEGMENT.fullmatch(daemon) and daemon not in (".", ".."):
        return f"{DEMAND_PREFIX}/{daemon}"
    digest = hashlib.blake2b(daemon.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()
    return f"{DEMAND_PREFIX}/{_UNSAFE.sub('_', daemon)[:64]}-{digest}"


def encode(report: DemandReport) -> bytes:
    return jsoncodec.canonical(
        {
            "daemon": report.daemon,
            "in_flight": dict(report.in_flight),
            "waiting": [{"taints": list(t), "count": n} for t, n in report.waiting.items()],
        }
    )


def decode(entry: Entry) -> DemandReport:
    """The report in ``entry``; ``ValueError`` when it is over the bound or malformed."""
    if len(entry.value) > MAX_REPORT_BYTES:
        raise ValueError(f"{len(entry.value)} bytes; at most {MAX_REPORT_BYTES} are read")
    body = jsoncodec.read(entry.value)
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    in_flight = body.get("in_flight")
    waiting = body.get("waiting")
    if not isinstance(in_flight, dict) or not isinstance(waiting, list):
        raise ValueError("in_flight must be an object and waiting a list")
    return DemandReport(
        daemon=str(body.get("daemon", "")),
        in_flight={str(k): _count(n) for k, n in in_flight.items()},
        waiting={_taints(w): _count(w.get("count")) for w in waiting if isinstance(w, dict)},
    )


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"a count must be a whole number >= 0, got {value!r}")
    return value


def _taints(obj: dict[str, Any]) -> tuple[str, ...]:
    taints = obj.get("taints")
    if not isinstance(taints, list) or not all(isinstance(t, str) for t in taints):
        raise ValueError(f"taints must be a list of strings, got {taints!r}")
    return tuple(sorted(taints))


class Demand:
    """The demand every daemon reports, with this daemon's own read live (see the module
    docstring). ``others`` is the pool view's map of the other daemons' records."""

    def __init__(
        self,
        own: Callable[[], DemandReport],
        others: Callable[[], Mapping[str, DemandReport]],
    ) -> None:
        self.own = own
        self.others = others

    def snapshot(self) -> Snapshot:
        """Every daemon's figures now, added up once for a round of plans."""
        mine = self.own()
        reports = [mine, *(r for r in self.others().values() if r.daemon != mine.daemon)]
        return Snapshot(reports)


class Snapshot:
    """The daemons' reports added up: requests in flight per worker key (routers' counts)
    and requests waiting per required taint set."""

    def __init__(self, reports: Iterable[DemandReport]) -> None:
        self.routed: dict[str, int] = {}
        self.waiting_by: dict[tuple[str, ...], int] = {}
        for report in reports:
            for key, count in report.in_flight.items():
                self.routed[key] = self.routed.get(key, 0) + count
            for taints, count in report.waiting.items():
                self.waiting_by[taints] = self.waiting_by.get(taints, 0) + count

    def waiting(self, pools: Iterable[str]) -> dict[str, int]:
        """Requests waiting in any router for each of ``pools`` (a request counts for each
        pool taint it requires)."""
        counts = dict.fromkeys(pools, 0)
        for taints, count in self.waiting_by.items():
            for taint in taints:
                if taint in counts:
                    counts[taint] += count
        return counts


EMPTY: Final = Snapshot(())


class DemandPublisher:
    """This daemon's record (see the module docstring): ``run`` writes it while ``wanted()``
    says an elastic policy is stored, and takes it away (the lease revoked) when none is."""

    def __init__(
        self, store: Store, own: Callable[[], DemandReport], wanted: Callable[[], bool]
    ) -> None:
        self.store = store
        self.own = own
        self.wanted = wanted
        self._lease: Lease | None = None
        self._written: DemandReport | None = None

    async def run(self) -> None:
        """Publish every ``DEMAND_EVERY`` seconds until cancelled; a store error is logged
        and the next tick tries again."""
        try:
            while True:
                try:
                    await self._tick()
                except StoreError as exc:
                    log.warning("pool demand not published, trying again: %s", exc)
                await asyncio.sleep(DEMAND_EVERY)
        finally:
            await self._withdraw()

    async def _tick(self) -> None:
        if not self.wanted():
            await self._withdraw()
            return
        report = self.own()
        if self._lease is None:
            self._lease = await self.store.grant(DEMAND_TTL)
            self._written = None
        elif report == self._written:
            try:
                await self.store.refresh(self._lease)
                return
            except LeaseExpiredError:
                self._lease = await self.store.grant(DEMAND_TTL)
        await self.store.put(demand_key(report.daemon), encode(report), lease=self._lease)
        self._written = report

    async def _withdraw(self) -> None:
        lease, self._lease, self._written = self._lease, None, None
        if lease is not None:
            with contextlib.suppress(StoreError):
                await self.store.revoke(lease)
