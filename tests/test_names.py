"""Every class and type alias in ``dynamod/`` and ``dynamoctl/`` has a name of its own: a
name defined twice means two things to a reader who greps for it (generated code aside).

A type alias is a module-level ``X: TypeAlias = ...``, or a capitalised ``X = ...`` whose
value is a type expression: a subscript (``dict[str, Any]``, ``Annotated[...]``), a union
(``A | B``), or ``TypeVar`` / ``NewType`` / ``Literal``.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ("dynamod/api/v1/", "dynamoctl/generated/")
TYPE_CALLS = {"TypeVar", "NewType", "Literal", "ParamSpec"}


def _is_type_side(side: ast.expr) -> bool:
    """One side of ``A | B``: a name, ``None`` or a type expression (not a number)."""
    if isinstance(side, ast.Constant):
        return side.value is None
    return isinstance(side, ast.Name | ast.Attribute) or _is_type_expression(side)


def _is_type_expression(value: ast.expr) -> bool:
    if isinstance(value, ast.Subscript):
        return True
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.BitOr):
        return all(_is_type_side(side) for side in (value.left, value.right))
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        return value.func.id in TYPE_CALLS
    return False


def defined_names(tree: ast.Module) -> Iterator[str]:
    """The classes and type aliases ``tree`` defines at module level."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            yield node.name
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            annotation = node.annotation
            if isinstance(annotation, ast.Name) and annotation.id == "TypeAlias":
                yield node.target.id
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            [target] = node.targets
            if (
                isinstance(target, ast.Name)
                and target.id[:1].isupper()
                and not target.id.isupper()
                and _is_type_expression(node.value)
            ):
                yield target.id


def definitions() -> dict[str, list[str]]:
    where: dict[str, list[str]] = defaultdict(list)
    for package in ("dynamod", "dynamoctl"):
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative.startswith(GENERATED):
                continue
            for name in defined_names(ast.parse(path.read_text(), relative)):
                where[name].append(relative)
    return where


def test_the_scan_finds_classes_and_aliases() -> None:
    tree = ast.parse(
        "class Aa: pass\nBb = dict[str, int]\nCc: TypeAlias = int\nDd = int | None\n"
        "Ee = TypeVar('Ee')\nMAX = 3\nff = print\nGg = make()\nHh = 2 | 1\n"
    )
    assert list(defined_names(tree)) == ["Aa", "Bb", "Cc", "Dd", "Ee"]


def test_no_class_or_type_alias_is_defined_twice() -> None:
    twice = {name: paths for name, paths in definitions().items() if len(paths) > 1}
    assert not twice, "defined more than once:\n" + "\n".join(
        f"  {name}: {', '.join(paths)}" for name, paths in sorted(twice.items())
    )
