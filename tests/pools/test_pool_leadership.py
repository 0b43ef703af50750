"""The parts of leader election that need no store: a term's fence and deadline, the
leader key's value. Also: the pure pool modules load without the store."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dynamod.errors import NotLeaderError
from dynamod.pools.leader import VALID_SHARE, Leadership, _decode, _encode, now
from dynamod.store import Lease


def term(deadline_in: float, ttl: float = 10.0) -> Leadership:
    return Leadership("me", 7, Lease(1, ttl), ttl, now() + deadline_in)


async def test_fence_returns_the_epoch_while_the_term_lasts() -> None:
    leadership = term(5.0)
    assert leadership.fence() == 7
    assert 0 < leadership.remaining() <= 5.0


async def test_fence_raises_once_the_deadline_passed_even_before_any_timer_ran() -> None:
    leadership = term(-0.001)
    with pytest.raises(NotLeaderError) as caught:
        leadership.fence()
    assert str(caught.value) == "me no longer leads (epoch 7): its lease was not refreshed for 5 s"
    assert leadership.lost.is_set() and leadership.remaining() == 0.0
    assert caught.value.code == "FAILED_PRECONDITION"


async def test_a_refresh_extends_the_term_to_half_the_ttl_after_it_was_sent() -> None:
    leadership = term(0.5)
    sent = now()
    leadership.extend(sent)
    assert leadership.remaining() == pytest.approx(10.0 * VALID_SHARE, abs=0.05)
    leadership.extend(sent - 100)  # a late answer to an older refresh never shortens it
    assert leadership.remaining() > 4.9


async def test_the_first_reason_to_depose_is_kept() -> None:
    leadership = term(5.0)
    leadership.depose("its lease has expired or was revoked")
    leadership.depose("its term ended")
    with pytest.raises(NotLeaderError, match=r"its lease has expired or was revoked$"):
        leadership.fence()


def test_the_leader_value_round_trips_and_garbage_is_nobodys() -> None:
    assert _decode(_encode("host:1", "abc", 42)) == ("host:1", "abc", 42)
    assert _decode(_encode("host:1", "abc")) == ("host:1", "abc", None)
    for garbage in (b"", b"{", b"[]", b'{"identity": 1, "term": "x"}', b'{"term": "x"}'):
        assert _decode(garbage) == ("", "", None)


def test_the_pure_pool_modules_load_without_the_store() -> None:
    """policy, apportion, plan and budget are values: they must not pull in the store (or
    anything above the value layer); the leader is imported from its own module."""
    code = (
        "import sys, dynamod.pools, dynamod.pools.policy, dynamod.pools.plan, "
        "dynamod.pools.move_budget, dynamod.pools.apportion\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('dynamod.store', "
        "'dynamod.discovery', 'dynamod.router', 'dynamod.control', 'grpc', 'aiohttp')))\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
