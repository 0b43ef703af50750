"""A policy document is bounded in the work it costs, not only in bytes (issue 28)."""

from __future__ import annotations

import json

import pytest

from dynamod.errors import PoolPolicyError
from dynamod.pools import document
from dynamod.pools.plan import OwnedWorker, plan
from dynamod.pools.policy import (
    MAX_POOLS,
    MAX_SPREAD_CELLS,
    PoolPolicy,
    name_in,
    read_document,
    spread_refusal,
)


def _bomb_yaml(levels: int) -> str:
    """The issue's bomb: 8 levels of ``&a [*prev x9]``, the last in ``name``."""
    out = ['x: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    out.extend(f"x{n}: &a{n} [{','.join([f'*a{n - 1}'] * 9)}]" for n in range(1, levels))
    out.append(f"name: [{','.join([f'*a{levels - 1}'] * 9)}]")
    return "\n".join(out) + "\nselector: model=m\npools: {p=a: 1, p=b: 1}\n"


def test_the_alias_bomb_is_refused_before_it_is_expanded() -> None:
    text = _bomb_yaml(8)
    assert len(text) < 600
    with pytest.raises(PoolPolicyError) as caught:
        PoolPolicy.parse(text)
    message = str(caught.value)
    assert message.startswith("policy: the document expands to more than 50000 values")
    assert len(message) < 300


def test_a_recursive_alias_is_refused() -> None:
    with pytest.raises(PoolPolicyError, match="recursive alias"):
        PoolPolicy.parse("name: &a [*a]\n")


def test_too_many_aliases_are_refused_even_when_small() -> None:
    text = "a: &x 1\nb: [" + ", ".join(["*x"] * (document.MAX_ALIASES + 1)) + "]\n"
    with pytest.raises(PoolPolicyError, match=f"more than {document.MAX_ALIASES} aliases"):
        PoolPolicy.parse(text)


def test_a_few_aliases_still_read() -> None:
    text = "name: a\nselector: model=m\npools: &p {p=a: 1, p=b: 2}\n"
    assert read_document(text) == {
        "name": "a",
        "selector": "model=m",
        "pools": {"p=a": 1, "p=b": 2},
    }


@pytest.mark.parametrize(
    "text", ["name: " + "[" * 30_000 + "]" * 30_000, "name: " + "[" * 40 + "]" * 40]
)
def test_deep_yaml_is_refused(text: str) -> None:
    with pytest.raises(PoolPolicyError, match=r"nest|not valid YAML"):
        PoolPolicy.parse(text)


@pytest.mark.parametrize("levels", [30_000, 40])
def test_deep_json_is_refused_not_a_recursion_error(levels: int) -> None:
    text = '{"name": ' + "[" * levels + "]" * levels + "}"
    with pytest.raises(PoolPolicyError) as caught:
        PoolPolicy.parse(text)
    assert str(caught.value).startswith(
        f"policy: the document nests deeper than {document.MAX_DEPTH}"
    )


def test_brackets_inside_json_strings_do_not_count_as_depth() -> None:
    name = "[" * 100 + '\\"{' * 50
    doc = {"name": json.loads(f'"{name}"'), "selector": "model=m", "pools": {"p=a": 1, "p=b": 1}}
    with pytest.raises(PoolPolicyError, match=r"^name: "):
        PoolPolicy.parse(json.dumps(doc))


@pytest.mark.parametrize(("text", "value"), [("1e308", 1e308), ("5e-324", 5e-324), ("2E3", 2000)])
def test_yaml_floats_without_a_dot_are_numbers(text: str, value: float) -> None:
    policy = PoolPolicy.parse(f"name: a\nselector: model=m\npools: {{p=a: {text}, p=b: 1}}\n")
    assert policy.pools["p=a"] == value


def test_a_refused_value_is_shown_as_a_bounded_prefix() -> None:
    big = [["lol"] * 1000] * 1000  # a million strings, shared rows
    shown = document.brief(big)
    assert shown.startswith("[['lol', 'lol'")
    assert shown.endswith("... (cut at 200 characters)")
    assert len(shown) < 260
    assert document.brief({"a": [1, 2]}) == "{'a': [1, 2]}"
    assert "bits" in document.brief(2**4000)


def test_the_name_of_a_refused_document_is_read_from_the_one_parse() -> None:
    assert name_in(read_document("name: good\npools: 1\n")) == "good"
    assert name_in(read_document("name: Not A Label\n")) == ""
    assert name_in(read_document("- 1\n")) == ""


def test_more_pools_than_the_limit_are_refused_naming_it() -> None:
    pools = {f"pool=p{i}": 1 for i in range(MAX_POOLS + 1)}
    with pytest.raises(PoolPolicyError) as caught:
        PoolPolicy("big", "model=m", pools, spread_by="zone")
    assert (
        str(caught.value)
        == f"pools: names {MAX_POOLS + 1} pool taints; the limit is 256 per policy"
    )


def test_the_issue_document_of_2000_pools_spread_over_zones_is_refused() -> None:
    pools = "\n".join(f"  pool=p{i}: 1" for i in range(2000))
    text = f"name: big\nselector: model=m\nspread_by: zone\npools:\n{pools}\n"
    with pytest.raises(PoolPolicyError, match="the limit is 256 per policy"):
        PoolPolicy.parse(text)


def test_a_plan_over_the_spread_limit_moves_nothing_and_says_why() -> None:
    policy = PoolPolicy("wide", "model=m", {"p=a": 1, "p=b": 1, "p=c": 1}, spread_by="zone")
    domains = MAX_SPREAD_CELLS // 3 + 1
    workers = [OwnedWorker(f"w{i}", domain=f"z{i}") for i in range(domains)]
    result = plan(policy, workers)
    assert result.moves == () and result.wanted_by_domain == {}
    assert result.refused == spread_refusal(policy, domains)
    assert f"{3 * domains} cells; the limit is {MAX_SPREAD_CELLS}" in result.refused
    assert plan(policy, workers[:-1]).moves  # one domain fewer: within the limit, planned
