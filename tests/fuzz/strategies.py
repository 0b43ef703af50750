"""Hypothesis strategies for hostile input: taints that break the grammar in every way we
can think of, look-alikes of the reserved ``dynamo.topology/`` prefix, oversized and
non-ASCII text, and arbitrary JSON.

``invalid(taint)`` is the partition the tests rely on; it asks the grammar itself
(``dynamod.taints.validate``, covered by its own unit tests), so the fuzz tests check what
the *surfaces* do with input the grammar refuses: a clear 4xx, nothing written, no crash.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from dynamod.errors import TaintError
from dynamod.taints import TOPOLOGY_PREFIX, validate

_LABEL = r"[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?"
_NAME = r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,8}[A-Za-z0-9])?"

valid_taints = st.from_regex(rf"\A({_LABEL}(\.{_LABEL})?/)?{_NAME}(={_NAME})?\Z")
"""Taints the grammar accepts (never reserved: no label is ``dynamo.topology``)."""

RESERVED_BASES = (f"{TOPOLOGY_PREFIX}zone=z1", f"{TOPOLOGY_PREFIX}zone", f"{TOPOLOGY_PREFIX}x=y")
# Characters that look like, hide inside or stand in for the prefix's own.
CONFUSABLES = (
    "\u03bf",  # Greek small omicron, looks like 'o'
    "\u0430",  # Cyrillic small a
    "\uff0e",  # fullwidth full stop
    "\u3002",  # ideographic full stop
    "\uff0f",  # fullwidth solidus
    "\u2215",  # division slash
    "\u200b",  # zero-width space
    "\u200d",  # zero-width joiner
    "\u00ad",  # soft hyphen
    "\ufeff",  # byte order mark
    " ",
    "\t",
    "\n",
    "/",
    ".",
    "-",
    "_",
    "=",
    "\x00",
    "D",
    "\u0130",  # capital I with dot: lowercases to two characters
)


def _mutate(base: str, char: str, at: int, how: str) -> str:
    at %= len(base) + 1
    if how == "insert":
        return base[:at] + char + base[at:]
    if how == "replace" and at < len(base):
        return base[:at] + char + base[at + 1 :]
    return {"upper": base.upper(), "title": base.title()}.get(how, base + char)


look_alikes = st.builds(
    _mutate,
    st.sampled_from(RESERVED_BASES),
    st.sampled_from(CONFUSABLES),
    st.integers(min_value=0, max_value=40),
    st.sampled_from(("insert", "replace", "upper", "title", "append")),
) | st.sampled_from(RESERVED_BASES)
"""The reserved prefix, disguised: most are invalid, a few are ordinary valid taints."""

accepted_look_alikes = st.one_of(
    st.builds(
        lambda at, char: "dynamo.topology"[:at] + char + "dynamo.topology"[at:] + "/zone=z1",
        st.integers(min_value=1, max_value=14),
        st.sampled_from("abxyz019"),
    ),
    st.sampled_from(
        (
            "dynamo.topology.io/zone=z1",
            "x.dynamo.topology/zone=z1",
            "dynamo-topology/zone=z1",
            "dynamotopology/zone=z1",
            "topology.dynamo/zone=z1",
            "dynamo.topology",
            "dynamo.topology=zone",
        )
    ),
)
"""Near misses of the reserved prefix that are ordinary, valid taints."""

oversized = st.integers(min_value=64, max_value=3_000).flatmap(
    lambda n: st.sampled_from(("a" * n, "p" * n + "/x", "x=" + "v" * n, ("l." * (n // 2)) + "a/x"))
)
"""Names, values and prefixes over their limits (63 and 253 characters). Kept to a few kB:
an error message quoting one must still fit gRPC's 8 kB metadata limit; the tests for
really large input are explicit."""

nasty_text = st.text(max_size=80) | st.text(st.characters(codec="utf-8"), min_size=1, max_size=40)

any_taint = st.one_of(valid_taints, look_alikes, oversized, nasty_text)


def invalid(taint: str) -> bool:
    """Whether a caller may not set ``taint`` (bad grammar or the reserved prefix)."""
    try:
        validate(taint)
    except TaintError:
        return True
    return False


bad_taint_lists = st.lists(any_taint, min_size=1, max_size=6).filter(
    lambda taints: any(invalid(t) for t in taints)
)
"""Lists a caller might send where at least one taint must be refused."""

json_values: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from((2**1024, -(2**1024), 10**400))  # past what a float can hold
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | any_taint,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
"""Any JSON value, huge integers and non-finite floats included (Python's ``json``
writes those as ``NaN`` / ``Infinity``, and reads them back)."""
