"""The taint grammar, normalization, topology taints and routing constraints."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamod.errors import ConstraintError, TaintError, TopologyError, quoted
from dynamod.records import ModelCard, RuntimeConfig, WorkerRecord, validate_topology
from dynamod.taints import (
    MAX_TAINT_BYTES,
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


# --- the grammar: Dynamo's (any string), minus what cannot be routed on safely ---

RULE_CONTROL = "taints may not hold control, format or line-separator characters"


RESERVED = "uses reserved prefix 'dynamo.topology/'"


def too_long(char: str, count: int, size: int) -> str:
    shown = f"'{char * 299}... ({count} characters)"
    return f"taint {shown} is {size} bytes long (UTF-8); the limit is 1024 bytes"


def control(shown: str, code: int, at: int) -> str:
    return (
        f"taint {shown} has control or invisible character U+{code:04X} at position {at}; "
        + RULE_CONTROL
    )


RULE_LOOK = (
    "looks like reserved prefix 'dynamo.topology/' (another case, a Unicode compatibility "
    "form or a look-alike character); topology taints are generated from the worker's "
    "topology_domains"
)


def test_the_reserved_prefix_message_is_dynamos_byte_for_byte() -> None:
    with pytest.raises(TaintError) as caught:
        validate("dynamo.topology/zone=x")
    assert (
        str(caught.value)
        == "taint 'dynamo.topology/zone=x' uses reserved prefix 'dynamo.topology/'"
    )


@pytest.mark.parametrize(
    ("taint", "message"),
    [
        ("", "taint '' is empty"),
        (" capacity/fast", "taint ' capacity/fast' has leading or trailing whitespace"),
        ("pool=batch\u00a0", "taint 'pool=batch\\xa0' has leading or trailing whitespace"),
        ("a\tb", control("'a\\tb'", 0x09, 1)),
        ("a\nb", control("'a\\nb'", 0x0A, 1)),
        ("\x00", control("'\\x00'", 0x00, 0)),
        ("gpu\u200bh100", control("'gpu\\u200bh100'", 0x200B, 3)),
        ("a\u202eb", control("'a\\u202eb'", 0x202E, 1)),
        ("a\u2028b", control("'a\\u2028b'", 0x2028, 1)),
        ("a\ud800b", control("'a\\ud800b'", 0xD800, 1)),
        ("a\ufe0fb", control("'a\ufe0fb'", 0xFE0F, 1)),
        ("x" * 1025, too_long("x", 1025, 1025)),
        ("é" * 513, too_long("é", 513, 1026)),
        ("dynamo.topology/zone=x", f"taint 'dynamo.topology/zone=x' {RESERVED}"),
        ("dynamo.topology/", f"taint 'dynamo.topology/' {RESERVED}"),
        ("it's.dynamo.topology/", None),
    ],
)  # fmt: skip
def test_refused_taints_name_the_rule(taint: str, message: str | None) -> None:
    if message is None:
        assert validate(taint) == taint
        return
    with pytest.raises(TaintError) as caught:
        validate(taint)
    assert str(caught.value) == message
    assert caught.value.taint == taint


@pytest.mark.parametrize(
    "taint",
    [
        "DYNAMO.TOPOLOGY/zone=a",  # case
        "Dynamo.Topology/zone=a",
        "dynamo.topology\uff0fzone=a",  # fullwidth solidus (NFKC)
        "\uff44ynamo.topology/zone=a",  # fullwidth d (NFKC)
        "\U0001d41dynamo.topology/zone=a",  # mathematical bold d (NFKC)
        "dynamo\u2024topology/zone=a",  # one dot leader (NFKC)
        "dyn\u0430mo.topology/zone=a",  # Cyrillic a
        "dynamo.t\u03bfpology/zone=a",  # Greek omicron
        "dynamo.topology\u2215zone=a",  # division slash
        "dynamo\u3002topology/zone=a",  # ideographic full stop
        "dynam0.topo1ogy/zone=a",  # digits for o and l
        "dynamo.topoIogy/zone=a",  # capital I for l
        "dynamo.to\u0440ology/zone=a",  # Cyrillic er
        "\u0501ynamo.topology/",  # Cyrillic komi de
    ],
)
def test_look_alikes_of_the_reserved_prefix_are_refused(taint: str) -> None:
    with pytest.raises(TaintError) as caught:
        validate(taint)
    assert str(caught.value).endswith(RULE_LOOK)
    with pytest.raises(TaintError):  # a constraint may name the prefix, never a look-alike
        validate(taint, allow_reserved=True)


@pytest.mark.parametrize(
    "taint",
    [
        "fast",
        "capacity/fast",
        "pool=batch",
        "gpu:h100",  # Dynamo 1.6 accepts these three (issue 15)
        "Region/us=1",
        "dynamo.policy/version=run%2Fa:step%3A17",
        "dynamo.pool/mirror-of=ns/11",
        "a/b/c",
        "/fast",
        "capacity/",
        "=x",
        "pool=",
        "pool=a=b",
        "-fast",
        "Capacity/fast",
        "pool batch",
        "zone=é",
        "区域=东",
        "gpu,h100",
        "!x",
        'say "hi"',
        "x" * 1024,
        "é" * 512,
        "dynamo.io/cordoned",
        "dynamo.topologyx/zone=a",
        "dynamo.topology=x",
        "dynamo.topology",
        "dynamo.topology.io/zone=a",
        "x.dynamo.topology/zone=a",
        "dynamo-topology/zone=a",
        "topology.dynamo/zone=a",
    ],
)
def test_what_dynamo_accepts_is_accepted_unchanged(taint: str) -> None:
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
        assert text == text.strip() and 0 < len(text.encode()) <= MAX_TAINT_BYTES
        assert text.isprintable() or " " in text or any(ord(c) > 0x7F for c in text)
    assert not message or message.startswith(f"taint {quoted(text)} ")


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
            RuntimeConfig(topology_domains={"zone": "a\tb"}),
            'topology_domains entry "zone"="a\tb" does not make a valid taint: taint '
            "'dynamo.topology/zone=a\\tb' has control or invisible character U+0009 at "
            "position 22; taints may not hold control, format or line-separator characters",
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
            {"required_taints": [""]},
            "required_taints: taint '' is empty",
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
