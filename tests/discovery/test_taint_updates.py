"""``TaintUpdate`` beyond the grammar: the operator's taints a worker's own updates keep,
the limits on what an update may leave a worker, and set arithmetic that stays linear."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamod.errors import InvalidInputError, PermissionDeniedError, TaintLimitError
from dynamod.taints import CORDONED, OPERATOR_TAINTS, TaintLimits, TaintUpdate, key_of
from tests.support.factories import make_record

HELD = ("capacity/fast", CORDONED)


@pytest.mark.parametrize(
    ("update", "after"),
    [
        (TaintUpdate.replace(["pool=batch"]), ("dynamo.io/cordoned", "pool=batch")),
        (TaintUpdate.replace([]), ("dynamo.io/cordoned",)),
        (TaintUpdate.replace([CORDONED, "x"]), ("dynamo.io/cordoned", "x")),
        (TaintUpdate.clear(), ("dynamo.io/cordoned",)),
        (TaintUpdate.add(["x"]), ("capacity/fast", "dynamo.io/cordoned", "x")),
        (TaintUpdate.remove(["capacity/fast"]), ("dynamo.io/cordoned",)),
    ],
)
def test_a_workers_own_update_keeps_the_cordon(update: TaintUpdate, after: tuple[str]) -> None:
    assert update.keeping(OPERATOR_TAINTS).apply(HELD) == after


@pytest.mark.parametrize(
    "update",
    [
        TaintUpdate.add([CORDONED]),
        TaintUpdate.replace([CORDONED, "capacity/fast"]),
    ],
)
def test_a_workers_own_update_cannot_cordon_it(update: TaintUpdate) -> None:
    with pytest.raises(PermissionDeniedError, match=r"'dynamo\.io/cordoned' is the operator's"):
        update.keeping(OPERATOR_TAINTS).apply(["capacity/fast"])


@pytest.mark.parametrize(
    "update", [TaintUpdate.remove([CORDONED]), TaintUpdate.remove([], keys=[CORDONED])]
)
def test_a_workers_own_update_cannot_uncordon_it_by_name_or_key(update: TaintUpdate) -> None:
    with pytest.raises(PermissionDeniedError, match="dynamoctl workers cordon / uncordon"):
        update.keeping(OPERATOR_TAINTS).apply(HELD)


def test_the_limits_refuse_growth_past_them_naming_limit_and_value() -> None:
    limits = TaintLimits(count=3, bytes=4096)
    record = make_record(taints=("a", "b"))
    with pytest.raises(TaintLimitError, match="4 taints; the limit is 3 taints per worker"):
        record.updated(TaintUpdate.add(["c", "d"]), limits)
    assert record.updated(TaintUpdate.add(["c"]), limits).taints == ("a", "b", "c")
    wide = TaintLimits(count=100, bytes=1024)
    with pytest.raises(TaintLimitError, match="1026 bytes of taints; the limit is 1024 bytes"):
        record.updated(TaintUpdate.add(["x" * 1021]), wide)
    assert not TaintLimitError.retryable and TaintLimitError.code == "INVALID_ARGUMENT"


def test_a_set_over_a_lowered_limit_may_still_shrink() -> None:
    limits = TaintLimits(count=1, bytes=1024)
    record = make_record(taints=("a", "b", "c"))
    assert record.updated(TaintUpdate.remove(["a"]), limits).taints == ("b", "c")
    with pytest.raises(TaintLimitError):
        record.updated(TaintUpdate.replace(["x", "y", "z", "w"]), limits)


@pytest.mark.parametrize(("count", "size"), [(0, 4096), (10, 1023)])
def test_limits_that_allow_no_taint_are_refused(count: int, size: int) -> None:
    with pytest.raises(InvalidInputError, match="at least one taint of 1024 bytes"):
        TaintLimits(count, size)


taint_sets = st.frozensets(st.sampled_from(["a", "b", "a=1", "a=2", "c=1", "d"]), max_size=6)


@given(held=taint_sets, named=taint_sets, keys=st.frozensets(st.sampled_from("abcd")))
def test_remove_is_the_set_difference_by_name_and_key(
    held: frozenset[str], named: frozenset[str], keys: frozenset[str]
) -> None:
    update = TaintUpdate.remove(named or ["a"], keys)
    expected = {t for t in held - set(update.taints) if key_of(t) not in keys}
    assert update.apply(held) == tuple(sorted(expected))


class CountedKey(str):
    """A key that counts the comparisons made against it."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        CountedKey.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_removing_many_keys_from_many_taints_does_no_pairwise_work() -> None:
    # Quadratic set arithmetic compares every taint's key with every removed key
    # (12,000 x 6,000 here); linear arithmetic at most once per taint. Counted, not timed.
    held = [f"k{i}=v" for i in range(12_000)]
    update = TaintUpdate.remove([], keys=[CountedKey(f"k{i}") for i in range(0, 12_000, 2)])
    CountedKey.compared = 0
    after = update.apply(held)
    assert len(after) == 6_000
    assert CountedKey.compared <= len(held)
