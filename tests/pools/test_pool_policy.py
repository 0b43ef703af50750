"""Pool policies: every refusal rule with its exact message and an accepted twin, the
canonical form, and when two policies overlap."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamod.errors import InvalidInputError, PoolPolicyError
from dynamod.pools.policy import (
    MAX_POLICY_BYTES,
    Elastic,
    PoolPolicy,
    disjoint,
    overlaps,
    refuse_overlaps,
)
from dynamod.selectors import parse
from tests.support.factories import make_record

ISSUE_EXAMPLE = """\
name: interactive-split
selector: model=demo-llama      # dynamoctl's selector syntax: the workers this policy owns
pools:                          # pool taint -> weight; each owned worker carries exactly one
  pool=fast: 40
  pool=slow: 60
"""
KNOWN = "name, selector, pools, min_per_pool, max_moves, move_interval, spread_by, paused, elastic"
ELASTIC_KNOWN = "target_in_flight, scale_down_after, tolerance"
NOT_A_TARGET = [
    (-1, "-1"),
    (0, "0"),
    (True, "True"),
    ("2", "'2'"),
    (math.nan, "nan"),
    (math.inf, "inf"),
]


def doc(**changes: object) -> dict[str, object]:
    """The issue's policy as a dict, with ``changes`` (a value of ``...`` drops the key)."""
    base: dict[str, object] = {
        "name": "interactive-split",
        "selector": "model=demo-llama",
        "pools": {"pool=fast": 40, "pool=slow": 60},
    }
    base.update(changes)
    return {k: v for k, v in base.items() if v is not ...}


REFUSED = [
    (doc(pols={}), f"policy: unknown key 'pols' (known: {KNOWN})"),
    (doc(pools=...), "policy: missing key 'pools' (required: name, selector, pools)"),
    (doc(name=5), "name: must be a string, got 5"),
    *(
        (
            doc(name=bad),
            f"name: {bad!r} must be 1 to 63 lowercase letters, digits or '-', starting and "
            "ending with a letter or digit (a DNS label)",
        )
        for bad in ("Interactive_Split", "-split", "split-", "", "a" * 64, "split.v2")
    ),
    (doc(selector=7), "selector: must be a string, got 7"),
    (doc(selector="model="), "selector: selector term 'model=' needs a value after '='"),
    (
        doc(selector="  "),
        "selector: must not be empty (it would own every worker of every model); name the "
        "workers, e.g. model=NAME",
    ),
    *(
        (
            doc(selector=f"model=demo-llama,{term}"),
            "selector: term 'pool=fast' names one of the policy's own pool taints; the workers "
            "it selects would change as the policy moves them",
        )
        for term in ("pool=fast", "!pool=fast")
    ),
    (
        doc(pools=["pool=fast", "pool=slow"]),
        "pools: must be a mapping of pool taint to weight, got ['pool=fast', 'pool=slow']",
    ),
    (doc(pools={"pool=fast": 1}), "pools: needs at least two pool taints, got 1 (['pool=fast'])"),
    (doc(pools={1: 1, "pool=slow": 1}), "pools: taint 1 must be a string"),
    (
        doc(pools={"dynamo.topology/zone=a": 1, "pool=slow": 1}),
        "pools: taint 'dynamo.topology/zone=a' uses reserved prefix 'dynamo.topology/'",
    ),
    (
        doc(pools={"Dynamo.Topology/zone=a": 1, "pool=slow": 1}),
        "pools: taint 'Dynamo.Topology/zone=a' looks like reserved prefix 'dynamo.topology/' "
        "(another case, a Unicode compatibility form or a look-alike character); topology "
        "taints are generated from the worker's topology_domains",
    ),
    (
        doc(pools={"dynamo.io/cordoned": 1, "pool=slow": 1}),
        "pools: taint 'dynamo.io/cordoned' is the operator's (set and lifted by dynamoctl "
        "workers cordon / uncordon); a policy cannot own it",
    ),
    (
        doc(pools={" pool=fast": 1, "pool=slow": 1}),
        "pools: taint ' pool=fast' has leading or trailing whitespace",
    ),
    *(
        (
            doc(pools={"pool=fast": bad, "pool=slow": 60}),
            f"pools: weight of 'pool=fast' must be a positive number, got {shown}",
        )
        for bad, shown in (
            (-1, "-1"),
            (0, "0"),
            (0.0, "0.0"),
            (True, "True"),
            ("40", "'40'"),
            (None, "None"),
            (math.nan, "nan"),
            (math.inf, "inf"),
        )
    ),
    *(
        (
            doc(min_per_pool=bad),
            f"min_per_pool: must be a whole number of workers, 0 or more, got {bad!r}",
        )
        for bad in (-1, 1.5, True, "1")
    ),
    *(
        (doc(max_moves=bad), f"max_moves: must be a whole number of moves, 1 or more, got {bad!r}")
        for bad in (0, -3, 2.0, False)
    ),
    *(
        (
            doc(max_moves=2, move_interval=bad),
            f"move_interval: must be a positive number of seconds, got {bad!r}",
        )
        for bad in (0, -1, math.nan, "60", True)
    ),
    (
        doc(move_interval=60),
        "move_interval: applies only with max_moves (at most max_moves moves per move_interval "
        "seconds); add max_moves or remove move_interval",
    ),
    *(
        (
            doc(spread_by=bad),
            "spread_by: must be a topology domain name such as 'zone' (workers hold it as "
            f"dynamo.topology/zone=VALUE), got {bad!r}",
        )
        for bad in ("", " zone", "zone=a", 5)
    ),
    (doc(paused="yes"), "paused: must be true or false, got 'yes'"),
    (doc(paused=1), "paused: must be true or false, got 1"),
    *(
        (
            doc(elastic=bad),
            f"elastic: must be a mapping of keys ({ELASTIC_KNOWN}), got {shown}",
        )
        for bad, shown in ((2, "2"), ([2], "[2]"), ("on", "'on'"))
    ),
    (
        doc(elastic={"target_in_flight": 2, "window": 10}),
        f"elastic: unknown key 'window' (known: {ELASTIC_KNOWN})",
    ),
    (
        doc(elastic={"scale_down_after": 10}),
        "elastic: missing key 'target_in_flight' (the requests in flight per worker a pool "
        "should hold: one number for every pool, or a map pool taint -> number)",
    ),
    *(
        (
            doc(elastic={"target_in_flight": bad}),
            "elastic.target_in_flight: must be a positive number of requests in flight per "
            f"worker, or a map of pool taint to one, got {shown}",
        )
        for bad, shown in [*NOT_A_TARGET, (None, "None"), ([2], "[2]")]
    ),
    *(
        (
            doc(elastic={"target_in_flight": {"pool=fast": bad}}),
            "elastic.target_in_flight: target of 'pool=fast' must be a positive number of "
            f"requests in flight per worker, got {shown}",
        )
        for bad, shown in NOT_A_TARGET
    ),
    (
        doc(elastic={"target_in_flight": {"pool=fast": 2, "pool=premium": 2}}),
        "elastic.target_in_flight: names 'pool=premium', which is not a pool of this policy "
        "(pools: 'pool=fast', 'pool=slow')",
    ),
    (
        doc(elastic={"target_in_flight": {}}),
        "elastic.target_in_flight: the map names no pool; name at least one pool taint, or "
        "give one number for every pool",
    ),
    *(
        (
            doc(elastic={"target_in_flight": 2, "scale_down_after": bad}),
            f"elastic.scale_down_after: must be a number of seconds, 0 or more, got {shown}",
        )
        for bad, shown in (
            (-1, "-1"),
            (-0.5, "-0.5"),
            (math.inf, "inf"),
            (math.nan, "nan"),
            ("60", "'60'"),
            (False, "False"),
            (None, "None"),
        )
    ),
    *(
        (
            doc(elastic={"target_in_flight": 2, "tolerance": bad}),
            f"elastic.tolerance: must be a fraction from 0 up to (not including) 1, got {shown}",
        )
        for bad, shown in (
            (1, "1"),
            (1.5, "1.5"),
            (-0.1, "-0.1"),
            (math.nan, "nan"),
            (True, "True"),
        )
    ),
    (
        doc(spread_by="zone", elastic={"target_in_flight": 2}),
        "elastic: elastic pools do not support spread_by (spread_by is 'zone'); remove "
        "spread_by or elastic",
    ),
]

ACCEPTED = [
    doc(),
    doc(name="a"),
    doc(name="a" * 63),
    doc(name="0-split-9"),
    doc(selector="model=demo-llama,!dynamo.io/cordoned,capacity/fast"),
    doc(selector="dynamo.topology/zone=a"),
    doc(pools={"pool=fast": 1, "pool=slow": 1, "pool=batch": 1}),
    doc(pools={"dynamo.io/pool-a": 1, "gpu,h100": 2}),
    doc(pools={"pool=fast": 0.5, "pool=slow": 1e-9}),
    doc(pools={"pool=fast": 10**30, "pool=slow": 1}),
    doc(min_per_pool=0),
    doc(min_per_pool=3),
    doc(max_moves=1),
    doc(max_moves=2, move_interval=0.5),
    doc(spread_by="zone"),
    doc(spread_by="topology.kubernetes.io/zone"),
    doc(paused=True),
    doc(elastic={"target_in_flight": 2}),
    doc(elastic={"target_in_flight": 0.5, "scale_down_after": 0, "tolerance": 0}),
    doc(elastic={"target_in_flight": {"pool=fast": 1.5}, "scale_down_after": 12.5}),
    doc(elastic={"target_in_flight": {"pool=fast": 2, "pool=slow": 10**6}, "tolerance": 0.99}),
]


@pytest.mark.parametrize(("document", "message"), REFUSED)
def test_a_bad_policy_is_refused_naming_field_rule_and_value(
    document: dict[str, object], message: str
) -> None:
    with pytest.raises(PoolPolicyError) as caught:
        PoolPolicy.from_dict(document)
    assert str(caught.value) == message


@pytest.mark.parametrize("document", ACCEPTED)
def test_the_accepted_twin_parses_and_round_trips(document: dict[str, object]) -> None:
    policy = PoolPolicy.from_dict(document)
    assert PoolPolicy.parse(policy.to_json()) == policy
    assert PoolPolicy.parse(json.dumps(document)) == policy


def test_the_issue_example_parses() -> None:
    policy = PoolPolicy.parse(ISSUE_EXAMPLE)
    assert policy.name == "interactive-split"
    assert policy.match == parse("model=demo-llama")
    assert dict(policy.pools) == {"pool=fast": 40, "pool=slow": 60}
    assert policy.key == "v1/pools/interactive-split"
    assert (policy.min_per_pool, policy.max_moves, policy.interval, policy.paused) == (
        0,
        None,
        None,
        False,
    )


def test_pool_policy_error_is_invalid_input_with_its_code() -> None:
    with pytest.raises(ValueError) as caught:
        PoolPolicy.parse("name: x")
    assert isinstance(caught.value, InvalidInputError)
    assert caught.value.code == "INVALID_ARGUMENT"


def test_a_policy_built_in_code_is_held_to_the_same_rules() -> None:
    with pytest.raises(PoolPolicyError, match=r"^pools: weight of 'b' must be"):
        PoolPolicy(name="x", selector="model=m", pools={"a": 1, "b": -2})


def test_a_document_over_the_size_limit_is_refused_before_parsing() -> None:
    fits = ISSUE_EXAMPLE + "#" * (MAX_POLICY_BYTES - len(ISSUE_EXAMPLE) - 1) + "\n"
    assert len(fits.encode()) == MAX_POLICY_BYTES
    assert PoolPolicy.parse(fits).name == "interactive-split"
    with pytest.raises(PoolPolicyError) as caught:
        PoolPolicy.parse(fits + "#")
    assert str(caught.value) == (
        f"policy: the document is {MAX_POLICY_BYTES + 1} bytes; the limit is 65536 bytes"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "name: x\npools:\n  a: 1\n  a: 2\n",
            "policy: key 'a' appears twice in one mapping (line 4)",
        ),
        ('{"name": "x", "name": "y"}', "policy: key 'name' appears twice in one mapping"),
        (
            "- 1\n- 2\n",
            "policy: the document must be a mapping of keys (name, selector, pools, "
            "...), got [1, 2]",
        ),
        (
            "name: [\n",
            "policy: the document is not valid YAML: did not find expected node content at line 2",
        ),
        ('{"name": ', "policy: the document is not valid JSON: Expecting value"),
        (b"name: \xff\n", "policy: the document is not UTF-8 text"),
        ("a: " + "1" * 5000, "policy: the document is not valid YAML: Exceeds the limit"),
        ('{"a": ' + "1" * 5000 + "}", "policy: the document is not valid JSON: Exceeds the limit"),
        ("!!python/object:os.system x\n", "policy: the document is not valid YAML: could not"),
    ],
)
def test_a_document_that_does_not_read_as_one_mapping_is_refused(
    text: str | bytes, message: str
) -> None:
    with pytest.raises(PoolPolicyError) as caught:
        PoolPolicy.parse(text)
    assert str(caught.value).startswith(message)


def test_applying_the_same_document_twice_gives_the_same_bytes() -> None:
    yaml_form = PoolPolicy.parse(ISSUE_EXAMPLE)
    json_form = PoolPolicy.parse(
        '{"pools": {"pool=slow": 60.0, "pool=fast": 40}, '
        '"selector": "model=demo-llama", "name": "interactive-split"}'
    )
    assert yaml_form == json_form
    assert yaml_form.to_json() == json_form.to_json() == PoolPolicy.parse(ISSUE_EXAMPLE).to_json()
    assert yaml_form.to_json() == (
        b'{"name":"interactive-split","pools":{"pool=fast":40,"pool=slow":60},'
        b'"selector":"model=demo-llama"}'
    )


def test_optional_keys_are_stored_only_when_set() -> None:
    policy = PoolPolicy.from_dict(doc(min_per_pool=1, max_moves=2, spread_by="zone", paused=True))
    assert json.loads(policy.to_json()) == {
        **doc(),
        "min_per_pool": 1,
        "max_moves": 2,
        "spread_by": "zone",
        "paused": True,
    }
    assert policy.interval == 60.0


def test_one_target_applies_to_every_pool_and_is_stored_as_the_map() -> None:
    """A single number and the map naming every pool are one policy, stored alike; the
    section's defaults are written out, whole floats as ints (as the weights are)."""
    one = PoolPolicy.from_dict(doc(elastic={"target_in_flight": 2.0}))
    every = PoolPolicy.from_dict(
        doc(elastic={"target_in_flight": {"pool=slow": 2, "pool=fast": 2}, "scale_down_after": 60})
    )
    assert one == every
    assert one.to_json() == every.to_json()
    assert json.loads(one.to_json())["elastic"] == {
        "target_in_flight": {"pool=fast": 2, "pool=slow": 2},
        "scale_down_after": 60,
        "tolerance": 0.1,
    }
    assert one.elastic is not None
    assert (one.elastic.target("pool=fast"), one.elastic.target("pool=slow")) == (2, 2)


def test_a_pool_the_map_does_not_name_is_not_elastic() -> None:
    policy = PoolPolicy.from_dict(doc(elastic={"target_in_flight": {"pool=fast": 1.5}}))
    assert policy.elastic is not None
    assert policy.elastic.target("pool=fast") == 1.5
    assert policy.elastic.target("pool=slow") is None
    assert dict(policy.elastic.target_in_flight) == {"pool=fast": 1.5}


def test_an_elastic_section_built_in_code_is_held_to_the_same_rules() -> None:
    section = Elastic({"pool=fast": 2}, scale_down_after=10.0)
    policy = PoolPolicy(
        name="x", selector="model=m", pools={"pool=fast": 1, "pool=slow": 1}, elastic=section
    )
    assert policy.elastic == section
    assert PoolPolicy.parse(policy.to_json()) == policy
    with pytest.raises(PoolPolicyError, match=r"^elastic.target_in_flight: names 'pool=fast'"):
        PoolPolicy(name="x", selector="model=m", pools={"a": 1, "b": 1}, elastic=section)
    with pytest.raises(PoolPolicyError, match=r"^elastic.tolerance: must be a fraction"):
        Elastic({"pool=fast": 2}, tolerance=1.0)


def test_a_policy_without_elastic_stores_no_section() -> None:
    policy = PoolPolicy.from_dict(doc())
    assert policy.elastic is None
    assert "elastic" not in json.loads(policy.to_json())


def policy(name: str, selector: str, *pools: str) -> PoolPolicy:
    return PoolPolicy(name=name, selector=selector, pools=dict.fromkeys(pools, 1))


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ("model=a", "model=b"),
        ("model=a", "model!=a"),
        ("capacity/fast", "!capacity/fast"),
        ("model=a,capacity/fast", "model=a,!capacity/fast"),
        ("dynamo.topology/zone=a", "dynamo.topology/zone=b"),
        ("id=abc", "id=abd"),
    ],
)
def test_selectors_that_exclude_each_other_do_not_overlap(left: str, right: str) -> None:
    assert disjoint(parse(left), parse(right))
    assert not overlaps(policy("x", left, "p=1", "p=2"), policy("y", right, "p=1", "p=2"))


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ("model=a", "model=a"),
        ("model=a", "capacity/fast"),
        ("model=a", "model!=b"),
        ("capacity/fast", "!capacity/slow"),
        ("dynamo.topology/zone=a", "dynamo.topology/region=b"),
        # zone=a=b could be domain "zone=a" with value "b": not provably one domain.
        ("dynamo.topology/zone=a=b", "dynamo.topology/zone=c"),
    ],
)
def test_selectors_that_could_share_a_worker_overlap(left: str, right: str) -> None:
    assert not disjoint(parse(left), parse(right))
    assert overlaps(policy("x", left, "p=1", "p=2"), policy("y", right, "p=2", "p=3"))


def test_policies_without_a_shared_pool_taint_never_overlap() -> None:
    assert not overlaps(policy("x", "model=a", "p=1", "p=2"), policy("y", "model=a", "q=1", "q=2"))


def test_refuse_overlaps_names_the_other_policy_and_skips_the_one_replaced() -> None:
    new = policy("x", "model=a", "p=1", "p=2")
    refuse_overlaps(
        new, [policy("x", "model=a", "p=1", "p=2"), policy("z", "model=b", "p=1", "p=2")]
    )
    with pytest.raises(PoolPolicyError) as caught:
        refuse_overlaps(new, [policy("y", "capacity/fast", "p=2", "p=3")])
    assert str(caught.value) == (
        "pools: 'p=2' is also owned by policy 'y', whose selector 'capacity/fast' can select the "
        "same workers as 'model=a'; use other pool taints, or selectors that exclude each "
        "other (such as different model= values)"
    )


TERMS = st.sampled_from(
    [
        "model=a",
        "model=b",
        "model!=a",
        "t1",
        "!t1",
        "t2",
        "!t2",
        "dynamo.topology/zone=a",
        "dynamo.topology/zone=b",
        "!dynamo.topology/zone=a",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    left=st.lists(TERMS, min_size=1, max_size=3),
    right=st.lists(TERMS, min_size=1, max_size=3),
    model=st.sampled_from(["a", "b", "c"]),
    taints=st.sets(st.sampled_from(["t1", "t2"])),
    zone=st.sampled_from([None, "a", "b"]),
)
def test_disjoint_is_sound_no_worker_matches_both(
    left: list[str], right: list[str], model: str, taints: set[str], zone: str | None
) -> None:
    """Whenever ``disjoint`` says so, no worker (any model, taints, zone) matches both."""
    a, b = parse(",".join(left)), parse(",".join(right))
    worker = make_record(model=model, taints=taints, topology={"zone": zone} if zone else None)
    if disjoint(a, b):
        assert not (a.matches(worker) and b.matches(worker))
