"""Between the stats stream's values (``dynamod/stats_results.py``) and the wire, both
ways, so the server and the client cannot disagree."""

from __future__ import annotations

from dynamod.api.v1 import dynamo_pb2 as pb
from dynamod.errors import InvalidInputError
from dynamod.results import WorkerState
from dynamod.stats_results import FleetStats, PoolStats, StatsQuery, WorkerStats


def query_to_pb(query: StatsQuery) -> pb.WatchStatsRequest:
    return pb.WatchStatsRequest(
        selector=query.selector, sort=query.sort, reverse=query.reverse, limit=query.limit,
        offset=query.offset,
    )  # fmt: skip


def query_from_pb(message: pb.WatchStatsRequest) -> StatsQuery:
    """The request as a ``StatsQuery`` (its checks: ``InvalidInputError``); an empty sort
    is the default one."""
    return StatsQuery(
        message.selector, message.sort or "load", message.reverse, message.limit, message.offset
    )


def worker_to_pb(row: WorkerStats) -> pb.WorkerStats:
    message = pb.WorkerStats(
        id=row.id, model=row.model, state=str(row.state), pools=row.pools, taints=row.taints,
        in_flight=row.in_flight, engine_reports=row.running is not None,
        running=row.running or 0, waiting=row.waiting or 0, kv_usage=row.kv_usage or 0.0,
        requests_per_second=row.rps, mark=row.mark,
    )  # fmt: skip
    if row.first_byte_p50 is not None:
        message.first_byte_p50 = row.first_byte_p50
    return message


def worker_from_pb(message: pb.WorkerStats) -> WorkerStats:
    reports = message.engine_reports
    return WorkerStats(
        id=message.id,
        model=message.model,
        state=_state(message.state),
        pools=tuple(message.pools),
        taints=tuple(message.taints),
        in_flight=message.in_flight,
        running=message.running if reports else None,
        waiting=message.waiting if reports else None,
        kv_usage=message.kv_usage if reports else None,
        rps=message.requests_per_second,
        first_byte_p50=_optional(message, "first_byte_p50"),
        mark=message.mark,
    )


def stats_to_pb(stats: FleetStats) -> pb.FleetStats:
    message = pb.FleetStats(
        time=stats.time, interval_seconds=stats.interval, workers=stats.workers,
        matched=stats.matched, states={str(k): v for k, v in stats.states.items()},
        requests_per_second=stats.rps, queue_depth=stats.queue_depth,
        pools=[pb.PoolStats(policy=p.policy, pool=p.pool, target=p.target, actual=p.actual)
               for p in stats.pools],
        leader=stats.leader, epoch=stats.epoch, revision=stats.revision,
        rows=[worker_to_pb(r) for r in stats.rows], offset=stats.offset,
        id_prefix=stats.id_prefix, replica=stats.replica,
    )  # fmt: skip
    for name in ("first_byte_p50", "first_byte_p99", "propagation_p99"):
        value = getattr(stats, name)
        if value is not None:
            setattr(message, name, value)
    return message


def stats_from_pb(message: pb.FleetStats) -> FleetStats:
    return FleetStats(
        time=message.time,
        interval=message.interval_seconds,
        workers=message.workers,
        matched=message.matched,
        states={_state(k): v for k, v in message.states.items()},
        rps=message.requests_per_second,
        first_byte_p50=_optional(message, "first_byte_p50"),
        first_byte_p99=_optional(message, "first_byte_p99"),
        queue_depth=message.queue_depth,
        pools=tuple(PoolStats(p.policy, p.pool, p.target, p.actual) for p in message.pools),
        leader=message.leader,
        epoch=message.epoch,
        revision=message.revision,
        propagation_p99=_optional(message, "propagation_p99"),
        rows=tuple(worker_from_pb(r) for r in message.rows),
        offset=message.offset,
        id_prefix=message.id_prefix,
        replica=message.replica,
    )


def _optional(message: pb.FleetStats | pb.WorkerStats, name: str) -> float | None:
    return float(getattr(message, name)) if message.HasField(name) else None  # type: ignore[arg-type]


def _state(text: str) -> WorkerState:
    try:
        return WorkerState(text)
    except ValueError:
        raise InvalidInputError(
            f"state {text[:40]!r} is not one of {', '.join(s.value for s in WorkerState)}"
        ) from None
