"""The taint grammar, normalization, topology taints and routing constraints."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamod.errors import ConstraintError, TaintError, TopologyError
from dynamod.model import ModelCard, RuntimeConfig, WorkerRecord, validate_topology
from dynamod.taints import (
    RoutingConstraints,
    caller_taints,
    is_topology,
    matches,
    normalize,
    preference,
    topology_taints,
    validate,
    validate_caller_taints,
)

MANY = settings(max_examples=1000, deadline=None)

name_chars = st.sampled_from("abcXYZ019-_.")
names = st.builds(
    lambda a, mid, b: a + mid + b,
    st.sampled_from("abzAZ09"),
    st.text(name_chars, max_size=8),
    st.sampled_from("abzAZ09"),
) | st.sampled_from("abzAZ09")
prefixes = st.lists(
    st.from_regex(r"[a-z0-9]([-a-z0-9]{0,4}[a-z0-9])?", fullmatch=True), min_size=1, max_size=3
).map(".".join)
valid_taints = st.builds(
    lambda p, n, v: (f"{p}/" if p else "") + n + (f"={v}" if v else ""),
    st.none() | prefixes,
    names,
    st.none() | names,
).filter(lambda t: not is_topology(t))


def record(topology: dict[str, str] | None = None, taints: tuple[str, ...] = ()) -> WorkerRecord:
    domains = topology or {}
    return WorkerRecord(
        instance_id="ab12",
        namespace="ns",
        component="backend",
        endpoint="generate",
        address="http://127.0.0.1:1",
        model_card=ModelCard(name="llama"),
        runtime_config=RuntimeConfig(
            taints=normalize((*taints, *topology_taints(domains))), topology_domains=domains
        ),
    )


# --- the grammar: every rule rejects with an exact message, and accepts its good twin ---


@pytest.mark.parametrize(
    ("taint", "message"),
    [
        (
            "dynamo.topology/zone=a",
            "taint 'dynamo.topology/zone=a' uses reserved prefix 'dynamo.topology/'; topology "
            "taints are generated from the worker's topology_domains",
        ),
        ("", "taint '' is empty"),
        ("/fast", "taint '/fast' has an empty prefix before '/'"),
        ("capacity/", "taint 'capacity/' has an empty name before '=' or at the end"),
        ("=x", "taint '=x' has an empty name before '=' or at the end"),
        ("pool=", "taint 'pool=' has an empty value after '='"),
        ("a/b/c", "taint 'a/b/c' has more than one '/'; the form is [prefix/]name[=value]"),
        (
            "p" * 254 + "/x",
            "taint '" + "p" * 254 + "/x' has a prefix of 254 characters; the limit is 253",
        ),
        (
            "Capacity/fast",
            "taint 'Capacity/fast' has prefix 'Capacity' that is not a lowercase DNS subdomain "
            "(labels of a-z, 0-9 and '-', separated by '.', each starting and ending with a "
            "letter or digit)",
        ),
        (
            "-x.io/fast",
            "taint '-x.io/fast' has prefix '-x.io' that is not a lowercase DNS subdomain "
            "(labels of a-z, 0-9 and '-', separated by '.', each starting and ending with a "
            "letter or digit)",
        ),
        ("n" * 64, "taint '" + "n" * 64 + "' has a name of 64 characters; the limit is 63"),
        (
            "k=" + "v" * 64,
            "taint 'k=" + "v" * 64 + "' has a value of 64 characters; the limit is 63",
        ),
        (
            "pool batch",
            "taint 'pool batch' has name 'pool batch' with character ' '; allowed are letters, "
            "digits, '-', '_' and '.'",
        ),
        (
            "pool=a=b",
            "taint 'pool=a=b' has value 'a=b' with character '='; allowed are letters, digits, "
            "'-', '_' and '.'",
        ),
        (
            "zone=é",
            "taint 'zone=é' has value 'é' with character 'é'; allowed are letters, digits, "
            "'-', '_' and '.'",
        ),
        (
            "-fast",
            "taint '-fast' has name '-fast' that does not start and end with a letter or digit",
        ),
        (
            "pool=batch_",
            "taint 'pool=batch_' has value 'batch_' that does not start and end with a letter "
            "or digit",
        ),
    ],
)
def test_invalid_taint_is_rejected_with_the_rule(taint: str, message: str) -> None:
    with pytest.raises(TaintError) as caught:
        validate(taint)
    assert str(caught.value) == message
    assert caught.value.taint == taint


@pytest.mark.parametrize(
    "taint",
    [
        "fast",
        "capacity/fast",
        "pool=batch",
        "example.com/gpu=h100",
        "a",
        "x" * 63,
        "p" * 253 + "/x",
        "k=" + "v" * 63,
        "my-label_1.2",
        "dynamo.io/cordoned",
        "dynamo.topologyx/zone=a",
        "dynamo.topology=x",
    ],
)
def test_valid_taint_is_returned_unchanged(taint: str) -> None:
    assert validate(taint) == taint


def test_reserved_prefix_is_allowed_only_when_asked() -> None:
    assert validate("dynamo.topology/zone=a", allow_reserved=True) == "dynamo.topology/zone=a"


@MANY
@given(st.text())
def test_validation_never_raises_anything_but_taint_error(text: str) -> None:
    try:
        result = validate(text)
    except TaintError as exc:
        message = str(exc)
    else:
        message = ""
        assert result == text
    assert not message or message.startswith(f"taint {text!r} ")


@MANY
@given(valid_taints)
def test_generated_valid_taints_pass(taint: str) -> None:
    assert validate(taint) == taint


@MANY
@given(st.lists(st.text(max_size=6)))
def test_normalize_is_idempotent_and_order_insensitive(taints: list[str]) -> None:
    once = normalize(taints)
    assert normalize(once) == once
    assert normalize(reversed(taints)) == once
    assert normalize([*taints, *taints]) == once
    assert list(once) == sorted(set(taints))


def test_caller_taints_collapse_duplicates_and_sort() -> None:
    assert validate_caller_taints(["b", "a", "b"]) == ("a", "b")


def test_caller_taints_refuse_the_first_reserved_one() -> None:
    with pytest.raises(TaintError, match=r"'dynamo\.topology/rack=1' uses reserved prefix"):
        validate_caller_taints(["ok", "dynamo.topology/rack=1"])


# --- topology taints are generated, never caller-managed ---


def test_topology_taints_are_generated_from_domains() -> None:
    assert topology_taints({"zone": "us-east-1a", "rack": "r1"}) == (
        "dynamo.topology/rack=r1",
        "dynamo.topology/zone=us-east-1a",
    )


def test_apply_caller_taints_keeps_topology_and_replaces_the_rest() -> None:
    worker = record({"zone": "a"}, ("old",))
    updated = worker.with_caller_taints(["new", "capacity/fast"])
    assert updated.taints == ("capacity/fast", "dynamo.topology/zone=a", "new")
    cleared = updated.with_caller_taints([])
    assert cleared.taints == ("dynamo.topology/zone=a",)
    assert cleared.model_card == worker.model_card


@MANY
@given(
    st.dictionaries(names, names, max_size=3),
    st.lists(st.text(max_size=12) | valid_taints, max_size=6),
)
def test_no_input_can_add_drop_or_change_a_topology_taint(
    domains: dict[str, str], taints: list[str]
) -> None:
    worker = record(domains)
    try:
        updated = worker.with_caller_taints(taints)
    except TaintError:
        return
    assert tuple(t for t in updated.taints if is_topology(t)) == topology_taints(domains)
    assert caller_taints(updated.taints) == normalize(taints)


# --- topology metadata validation: exact messages ---


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (RuntimeConfig(topology_domains={" ": "a"}), "topology_domains keys must be non-empty"),
        (
            RuntimeConfig(topology_domains={" zone": "a"}),
            'topology_domains key " zone" must not contain leading or trailing whitespace',
        ),
        (
            RuntimeConfig(topology_domains={"zone": ""}),
            'topology_domains value for "zone" must be non-empty',
        ),
        (
            RuntimeConfig(topology_domains={"zone": "a "}),
            'topology_domains value for "zone" must not contain leading or trailing whitespace',
        ),
        (
            RuntimeConfig(topology_domains={"zone": "a b"}),
            'topology_domains entry "zone"="a b" does not make a valid taint: taint '
            "'dynamo.topology/zone=a b' has value 'a b' with character ' '; allowed are "
            "letters, digits, '-', '_' and '.'",
        ),
        (
            RuntimeConfig(topology_domains={"zone": "a"}, kv_transfer_domain=" "),
            "kv_transfer_domain must be non-empty when set",
        ),
        (
            RuntimeConfig(topology_domains={"zone": "a"}, kv_transfer_domain="zone "),
            "kv_transfer_domain must not contain leading or trailing whitespace",
        ),
        (
            RuntimeConfig(topology_domains={"zone": "a"}, kv_transfer_domain="rack"),
            'kv_transfer_domain "rack" must reference a key in topology_domains',
        ),
        (
            RuntimeConfig(kv_transfer_enforcement="required"),
            "kv_transfer_enforcement requires kv_transfer_domain",
        ),
        (
            RuntimeConfig(
                topology_domains={"zone": "a"},
                kv_transfer_domain="zone",
                kv_transfer_enforcement="fallback",
            ),
            "kv_transfer_enforcement must be 'required' or 'preferred', got 'fallback'",
        ),
        (
            RuntimeConfig(
                topology_domains={"zone": "a"},
                kv_transfer_domain="zone",
                kv_transfer_enforcement="preferred",
            ),
            "kv_transfer_preferred_weight is required when kv_transfer_enforcement is preferred",
        ),
        (
            RuntimeConfig(
                topology_domains={"zone": "a"},
                kv_transfer_domain="zone",
                kv_transfer_enforcement="required",
                kv_transfer_preferred_weight=0.5,
            ),
            "kv_transfer_preferred_weight can only be set when kv_transfer_enforcement is "
            "preferred",
        ),
        (
            RuntimeConfig(
                topology_domains={"zone": "a"},
                kv_transfer_domain="zone",
                kv_transfer_enforcement="preferred",
                kv_transfer_preferred_weight=1.1,
            ),
            "kv_transfer_preferred_weight must be from 0 to 1, got 1.1",
        ),
        (
            RuntimeConfig(
                topology_domains={"zone": "a"},
                kv_transfer_domain="zone",
                kv_transfer_enforcement="preferred",
                kv_transfer_preferred_weight=math.nan,
            ),
            "kv_transfer_preferred_weight must be from 0 to 1, got nan",
        ),
    ],
)
def test_invalid_topology_is_rejected_with_the_exact_message(
    config: RuntimeConfig, message: str
) -> None:
    with pytest.raises(TopologyError) as caught:
        validate_topology(config)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    "config",
    [
        RuntimeConfig(),
        RuntimeConfig(topology_domains={"zone": "us-east-1a", "rack": "r1"}),
        RuntimeConfig(topology_domains={"zone": "a"}, kv_transfer_domain="zone"),
        RuntimeConfig(
            topology_domains={"zone": "a"},
            kv_transfer_domain="zone",
            kv_transfer_enforcement="required",
        ),
        RuntimeConfig(
            topology_domains={"zone": "a"},
            kv_transfer_domain="zone",
            kv_transfer_enforcement="preferred",
            kv_transfer_preferred_weight=0.0,
        ),
        RuntimeConfig(
            topology_domains={"zone": "a"},
            kv_transfer_domain="zone",
            kv_transfer_enforcement="preferred",
            kv_transfer_preferred_weight=1.0,
        ),
    ],
)
def test_valid_topology_is_accepted(config: RuntimeConfig) -> None:
    validate_topology(config)


# --- routing constraints ---


def test_constraints_parse_from_json_and_match() -> None:
    constraints = RoutingConstraints.from_json(
        {"required_taints": ["capacity/fast"], "preferred_taints": {"pool=batch": -0.5}}
    )
    assert matches(("capacity/fast", "pool=batch"), constraints)
    assert not matches(("capacity/slow",), constraints)
    assert preference(("capacity/fast", "pool=batch"), constraints) == -0.5
    assert constraints.to_json() == {
        "required_taints": ["capacity/fast"],
        "preferred_taints": {"pool=batch": -0.5},
    }


def test_constraints_may_require_a_topology_taint() -> None:
    constraints = RoutingConstraints.from_json({"required_taints": ["dynamo.topology/zone=a"]})
    assert matches(("dynamo.topology/zone=a",), constraints)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("x", "routing_constraints must be a JSON object"),
        (
            {"required": ["a"]},
            "routing_constraints has unknown key 'required'; allowed keys are 'required_taints' "
            "and 'preferred_taints'",
        ),
        ({"required_taints": "a"}, "required_taints must be a JSON array of strings"),
        ({"required_taints": [1]}, "required_taints must be a JSON array of strings"),
        (
            {"required_taints": ["bad taint"]},
            "required_taints: taint 'bad taint' has name 'bad taint' with character ' '; "
            "allowed are letters, digits, '-', '_' and '.'",
        ),
        ({"preferred_taints": ["a"]}, "preferred_taints must be a JSON object of taint -> weight"),
        (
            {"preferred_taints": {"a": "1"}},
            "preferred taint 'a' has weight '1'; weights must be numbers from -1 to 1",
        ),
        (
            {"preferred_taints": {"a": True}},
            "preferred taint 'a' has weight True; weights must be numbers from -1 to 1",
        ),
        (
            {"preferred_taints": {"a": 1.5}},
            "preferred taint 'a' has weight 1.5; weights must be from -1 to 1",
        ),
    ],
)
def test_invalid_constraints_are_rejected(body: object, message: str) -> None:
    with pytest.raises(ConstraintError) as caught:
        RoutingConstraints.from_json(body)
    assert str(caught.value) == message


def test_empty_constraints_match_everything() -> None:
    assert matches((), RoutingConstraints.from_json(None))
    assert RoutingConstraints().describe() == "no constraints"
