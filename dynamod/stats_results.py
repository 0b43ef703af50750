"""What the stats stream reports (``dynamoctl top``), as plain frozen dataclasses.

A frame of the fleet (``FleetStats``): the header figures — workers by state, answers per
second and first-byte quantiles through the answering daemon over the frame's interval,
requests waiting in its router, each pool's target and actual count and who leads, the
store revision its view has reached and the watch lag of its own writes — and the rows
asked for (``WorkerStats``), in the order asked for (``StatsQuery``). ``stats_sampler.py``
builds them, ``api/stats_convert.py`` puts them on the wire and back, and
``dynamod.client`` hands them to dynamoctl and to Python programs.

The order of the rows (``SORTS``): ``load`` (the default) is the most in flight on the
worker by any count this daemon has — its router's requests, or the engine's running
plus waiting ones — then its KV use, then its answers per second, the busiest first;
``id``, ``model``, ``state``, ``pools``, ``taints`` and ``mark`` sort A to Z, the figures
(``inflight``, ``running``, ``waiting``, ``kv``, ``rps``, ``p50``) the largest first.
``reverse`` turns any of them round. Ties go by id.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from dynamod.errors import InvalidInputError
from dynamod.results import WorkerState
from dynamod.selectors import parse

SORTS: Final = (
    "load", "id", "model", "state", "pools", "taints", "inflight", "running", "waiting", "kv",
    "rps", "p50", "mark",
)  # fmt: skip
"""The orders a query may ask for; see the module docstring."""
MAX_ROWS: Final = 10_000
"""The most rows one frame may ask for (``limit``); 0 asks for every matching worker."""


@dataclass(frozen=True)
class StatsQuery:
    """Which rows a stream's frames carry: the workers ``selector`` matches (the ``-l``
    language; empty: all), sorted by ``sort`` (``SORTS``), ``offset`` of them skipped,
    then at most ``limit`` (0: all of them). Checked when built: ``InvalidInputError``
    names the value and the rule."""

    selector: str = ""
    sort: str = "load"
    reverse: bool = False
    limit: int = 0
    offset: int = 0

    def __post_init__(self) -> None:
        parse(self.selector)
        if self.sort not in SORTS:
            raise InvalidInputError(f"sort {self.sort[:40]!r} is not one of {', '.join(SORTS)}")
        if not 0 <= self.limit <= MAX_ROWS:
            raise InvalidInputError(
                f"limit {self.limit} is out of range; ask for 1 to {MAX_ROWS} rows, or 0 for all"
            )
        if self.offset < 0:
            raise InvalidInputError(f"offset {self.offset} is below 0; rows are counted from 0")


@dataclass(frozen=True)
class WorkerStats:
    """One worker as a frame shows it: its id, model, state, the pool taints it holds (of
    every stored policy) and all its taints; ``in_flight``: this daemon's router's
    requests there; ``running``, ``waiting`` and ``kv_usage`` (0..1) as its engine last
    reported them (None: it reports nothing); ``rps``: answers that began per second
    through this daemon over the frame's interval, and ``first_byte_p50`` their median
    time to first byte (None: no answer in the interval); ``mark``: why the boundary
    marked it ("" when it is not)."""

    id: str
    model: str
    state: WorkerState
    pools: tuple[str, ...] = ()
    taints: tuple[str, ...] = ()
    in_flight: int = 0
    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None
    rps: float = 0.0
    first_byte_p50: float | None = None
    mark: str = ""


@dataclass(frozen=True)
class PoolStats:
    """One pool of a policy: the routable workers it should have, and has, by the
    answering daemon's plan."""

    policy: str
    pool: str
    target: int
    actual: int


@dataclass(frozen=True)
class FleetStats:
    """One frame; see the module docstring. ``interval``: the seconds the rates and
    quantiles cover (0 in a first frame sent before any interval was sampled: no figures
    yet). ``workers``: every worker in the view; ``matched``: those the query's selector
    matches, and ``states`` counts those by state. ``rows`` start at ``offset`` among the
    matched workers in the query's order; ``id_prefix`` tells apart every id of the view
    (at least 8 characters)."""

    time: float
    interval: float
    workers: int
    matched: int
    states: Mapping[WorkerState, int] = field(default_factory=dict)
    rps: float = 0.0
    first_byte_p50: float | None = None
    first_byte_p99: float | None = None
    queue_depth: int = 0
    pools: tuple[PoolStats, ...] = ()
    leader: str = ""
    epoch: int = 0
    revision: int = 0
    propagation_p99: float | None = None
    """Seconds from this daemon's own taint writes to its view applying them (the watch
    lag), the 99th percentile over the interval; None when it wrote nothing then."""
    rows: tuple[WorkerStats, ...] = ()
    offset: int = 0
    id_prefix: int = 8
    replica: str = ""
