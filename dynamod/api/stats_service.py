"""The gRPC StatsService: the fleet's frames for ``dynamoctl top``.

Each call is identified, holds one of the ``StreamSlots`` while open, and is counted and
its errors mapped as the other servicers' are (``service.ServiceContext``); the frames are
the ``StatsSampler``'s (``dynamod/stats_sampler.py``): one at once, then one per sample,
until the caller leaves or the daemon drains (``StatsSampler.close``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from dynamod.api import stats_convert
from dynamod.api.context import Context
from dynamod.api.v1 import dynamo_pb2 as pb
from dynamod.api.v1 import dynamo_pb2_grpc as rpc
from dynamod.errors import DynamoError
from dynamod.stats_sampler import StatsSampler


class StatsService(rpc.StatsServiceServicer):
    def __init__(self, api: Any, sampler: StatsSampler) -> None:
        """``api``: the ``service.ServiceContext`` (not imported: it imports this module)."""
        self.api = api
        self.sampler = sampler

    async def WatchStats(
        self, request: pb.WatchStatsRequest, context: Context
    ) -> AsyncIterator[pb.FleetStats]:
        with contextlib.ExitStack() as held:
            try:
                caller = self.api.identify(context)
                query = stats_convert.query_from_pb(request)
                held.enter_context(self.api.slots.hold(caller))
            except DynamoError as exc:
                await self.api.fail("WatchStats", context, exc)
            watch = held.enter_context(self.sampler.watch())
            async for stats in watch.frames(query):
                yield stats_convert.stats_to_pb(stats)
        self.api.calls.labels("WatchStats", "OK").inc()
