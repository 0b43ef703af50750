"""kubectl's JSONPath templates and custom columns, on the objects ``-o json`` prints."""

from __future__ import annotations

import pytest

from dynamoctl.jsonpath import Shape, Template, TemplateError, parse_path, sort_key

LIST = {
    "kind": "List",
    "items": [
        {"id": "a1", "load": {"active_requests": 2}, "taints": ["x", "y"], "state": "ready"},
        {"id": "b2", "load": {"active_requests": 0}, "taints": [], "state": "cordoned"},
    ],
}


@pytest.mark.parametrize(
    ("template", "shown"),
    [
        ("{.items[*].id}", "a1 b2"),
        ("{.items[0].taints}", '["x","y"]'),
        ("{.items[-1].id}", "b2"),
        ("{.items[0:1].id}", "a1"),
        ("{.items[*]['id']}", "a1 b2"),
        ('{.items[?(@.state=="cordoned")].id}', "b2"),
        ("{.items[?(@.load.active_requests>1)].id}", "a1"),
        ("{..active_requests}", "2 0"),
        ("{.items[*].taints[*]}", "x y"),
        ("{.items[0].missing}", ""),
        ('{range .items[*]}{.id}{"\\t"}{.state}{"\\n"}{end}', "a1\tready\nb2\tcordoned\n"),
        ("ids: {$.items[*].id}.", "ids: a1 b2."),
    ],
)
def test_templates_print_as_kubectls_do(template: str, shown: str) -> None:
    assert Template(template).render(LIST) == shown


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("{.items[", "unbalanced brace"),
        ("{range .items[*]}{.id}", "{range} without {end}"),
        ("{end}", "{end} without {range}"),
        ("{.items[x]}", "[x] is not an index"),
        ("{.items[?(@.id==bare)]}", "'bare' is neither a quoted string nor a number"),
    ],
)
def test_a_template_that_does_not_parse_says_where(template: str, why: str) -> None:
    with pytest.raises(TemplateError) as caught:
        Template(template)
    assert str(caught.value).startswith(f"jsonpath {template!r}: ")
    assert why in str(caught.value)


def test_custom_columns_are_one_row_per_item() -> None:
    shape = Shape("custom-columns=ID:.id,TAINTS:.taints[*],REQ:{.load.active_requests}")
    assert shape.text(LIST["items"]).splitlines() == [
        "ID   TAINTS   REQ",
        "a1   x,y      2",
        "b2   <none>   0",
    ]
    assert Shape("custom-columns=ID:.id", no_headers=True).text(LIST["items"][1]) == "b2\n"


def test_sort_keys_put_numbers_then_strings_and_missing_last() -> None:
    items = [{"v": "b"}, {}, {"v": 3}, {"v": "a"}, {"v": 1.5}]
    path = parse_path(".v")
    assert sorted(items, key=lambda i: sort_key(path, i)) == [
        {"v": 1.5}, {"v": 3}, {"v": "a"}, {"v": "b"}, {},
    ]  # fmt: skip
