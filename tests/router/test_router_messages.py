"""A request no worker can take is told why in a sentence, bounded however many taints it
names or the workers hold (issue 28: 10,000 required taints made a 236,880-byte 503)."""

from __future__ import annotations

import pytest

from dynamod.errors import NoEligibleWorkerError
from dynamod.router import RouteRequest
from dynamod.router.table import MESSAGE_TAINTS
from dynamod.taints import RoutingConstraints
from tests.router.test_router_queue import router_with
from tests.router.test_router_table import worker


async def test_ten_thousand_required_taints_give_a_bounded_message() -> None:
    many = frozenset(f"need/t{i:05d}" for i in range(10_000))
    router = router_with(worker("A", *(f"held/h{i:04d}" for i in range(4000))), worker("B"))
    with pytest.raises(NoEligibleWorkerError) as refused:
        await router.acquire(RouteRequest("m", RoutingConstraints(required_taints=many)))
    said = str(refused.value)
    assert len(said) < 4000, len(said)
    first = " and ".join(f"need/t{i:05d}" for i in range(MESSAGE_TAINTS))
    assert said.startswith(f"no worker of model 'm' has {first} (and 9984 more); 2 workers: ")
    assert "held/h0014, held/h0015 (and 3984 more) (missing need/t00000, " in said
    assert said.count("(and 9984 more)") == 3  # the request's list, and each worker's missing
