"""kubectl's JSONPath templates, over the JSON objects ``-o json`` prints: ``-o
jsonpath=…``, the columns of ``-o custom-columns=…`` and the keys of ``--sort-by``.

A template is text with actions in braces: ``{.items[*].id}``, ``{range .items[*]}{.id}{"\\t"}
{.state}{"\\n"}{end}``. A path is ``$`` or ``@`` (may be left out), then steps: ``.name``
or ``['name']``, ``.*`` or ``[*]``, ``[n]`` (negative from the end), ``[a:b]``, ``..name``
(at any depth) and the filter ``[?(@.path OP value)]`` (``==``, ``!=``, ``<``, ``<=``,
``>``, ``>=``; a quoted string or a number; ``[?(@.path)]``: the path exists). As in
kubectl, the results of one action are joined by spaces, strings shown as they are and
lists and objects as JSON; a key that is missing gives nothing. A template that does
not parse raises ``TemplateError`` naming the template and the place.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from dynamod.errors import InvalidInputError

PathStep = Callable[[Any], Iterator[Any]]


class TemplateError(InvalidInputError):
    """A JSONPath template or a column list that does not parse."""


@dataclass(frozen=True)
class Path:
    """A parsed path: apply it to a value for every value it names."""

    text: str
    steps: tuple[PathStep, ...]

    def find(self, value: Any) -> list[Any]:
        found = [value]
        for step in self.steps:
            found = [out for one in found for out in step(one)]
        return found


@dataclass(frozen=True)
class _Range:
    path: Path
    body: tuple[Any, ...]


def parse_path(text: str) -> Path:
    """``.items[*].id`` (braces around it are allowed, as kubectl allows them)."""
    inner = text.strip()
    if inner.startswith("{") and inner.endswith("}"):
        inner = inner[1:-1].strip()
    return Path(text, tuple(_Steps(inner, text).parse()))


class Template:
    """A parsed ``-o jsonpath=`` template."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.nodes = _parse_template(text)

    def render(self, value: Any) -> str:
        return "".join(_render(self.nodes, value))


def show(value: Any) -> str:
    """One result as kubectl prints it."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float):
        return json.dumps(value)
    return json.dumps(value, separators=(",", ":"))


def _render(nodes: Sequence[Any], value: Any) -> Iterator[str]:
    for node in nodes:
        if isinstance(node, str):
            yield node
        elif isinstance(node, Path):
            yield " ".join(show(v) for v in node.find(value))
        else:
            for item in node.path.find(value):
                yield from _render(node.body, item)


_ACTION = re.compile(r"\{((?:[^{}\"']|\"(?:\\.|[^\"\\])*\"|'[^']*')*)\}")


def _parse_template(text: str) -> tuple[Any, ...]:
    try:
        return _nodes(text)
    except TemplateError as exc:
        if str(exc).startswith("jsonpath "):
            raise
        raise TemplateError(f"jsonpath {text!r}: {exc}") from None


def _nodes(text: str) -> tuple[Any, ...]:
    stack: list[tuple[Path | None, list[Any]]] = [(None, [])]
    at = 0
    for match in _ACTION.finditer(text):
        literal = text[at : match.start()]
        if "{" in literal or "}" in literal:
            where = match.start()
            raise TemplateError(f"jsonpath {text!r}: unbalanced brace before column {where}")
        if literal:
            stack[-1][1].append(literal)
        at = match.end()
        action = match.group(1).strip()
        if action.startswith("range "):
            stack.append((parse_path(action[6:]), []))
        elif action == "end":
            if len(stack) == 1:
                raise TemplateError(f"jsonpath {text!r}: {{end}} without {{range}}")
            path, body = stack.pop()
            assert path is not None
            stack[-1][1].append(_Range(path, tuple(body)))
        elif action.startswith('"'):
            stack[-1][1].append(_string(action, text))
        else:
            stack[-1][1].append(parse_path(action))
    rest = text[at:]
    if "{" in rest or "}" in rest:
        raise TemplateError(f"jsonpath {text!r}: unbalanced brace at column {at}")
    if rest:
        stack[-1][1].append(rest)
    if len(stack) != 1:
        raise TemplateError(f"jsonpath {text!r}: {{range}} without {{end}}")
    return tuple(stack[0][1])


def _string(action: str, text: str) -> str:
    try:
        found = json.loads(action)
    except json.JSONDecodeError:
        raise TemplateError(f"jsonpath {text!r}: {action} is not a quoted string") from None
    if not isinstance(found, str):
        raise TemplateError(f"jsonpath {text!r}: {action} is not a quoted string")
    return found


class _Steps:
    """The scanner of one path."""

    def __init__(self, text: str, template: str) -> None:
        self.text, self.template, self.at = text, template, 0
        if self.text[:1] in ("$", "@"):
            self.at = 1

    def fail(self, why: str) -> TemplateError:
        return TemplateError(f"path {self.template!r}: {why} at column {self.at}")

    def parse(self) -> Iterator[PathStep]:
        while self.at < len(self.text):
            if self.text.startswith("..", self.at):
                self.at += 2
                yield _descendants(self._name())
            elif self.text[self.at] == ".":
                self.at += 1
                if self.at == len(self.text):
                    return  # "." alone: the value itself
                yield _every if self._peek("*") else _key(self._name())
            elif self.text[self.at] == "[":
                yield self._bracket()
            else:
                raise self.fail(f"unexpected {self.text[self.at]!r}")

    def _peek(self, char: str) -> bool:
        if self.text.startswith(char, self.at):
            self.at += len(char)
            return True
        return False

    def _name(self) -> str:
        found = re.compile(r"[^.\[\]\s]+").match(self.text, self.at)
        if found is None:
            raise self.fail("a name is missing")
        self.at = found.end()
        return found.group()

    def _bracket(self) -> PathStep:
        end = self.text.find("]", self.at)
        if self.text.startswith("[?(", self.at):
            end = self.text.find(")]", self.at) + 1
        if end <= self.at:
            raise self.fail("'[' is not closed")
        inside = self.text[self.at + 1 : end].strip()
        self.at = end + 1
        if inside == "*":
            return _every
        if inside[:1] in ("'", '"') and inside[-1:] == inside[:1] and len(inside) > 1:
            return _key(inside[1:-1])
        if inside.startswith("?(") and inside.endswith(")"):
            return _filter(inside[2:-1].strip(), self)
        return _index(inside, self)


def _key(name: str) -> PathStep:
    def step(value: Any) -> Iterator[Any]:
        if isinstance(value, dict) and name in value:
            yield value[name]

    return step


def _every(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        yield from value.values()
    elif isinstance(value, list):
        yield from value


def _descendants(name: str) -> PathStep:
    def step(value: Any) -> Iterator[Any]:
        if isinstance(value, dict):
            if name in value:
                yield value[name]
            for item in value.values():
                yield from step(item)
        elif isinstance(value, list):
            for item in value:
                yield from step(item)

    return step


def _index(inside: str, scanner: _Steps) -> PathStep:
    try:
        if ":" in inside:
            start, _, stop = inside.partition(":")
            window = slice(int(start) if start else None, int(stop) if stop.strip() else None)
        else:
            number = int(inside)
            window = slice(number, number + 1 or None)
    except ValueError:
        raise scanner.fail(f"[{inside}] is not an index, a slice, * or a quoted key") from None

    def step(value: Any) -> Iterator[Any]:
        if isinstance(value, list):
            yield from value[window]

    return step


_COMPARE = re.compile(r"^(@[^=!<>\s]*)\s*(==|!=|<=|>=|<|>)\s*(.+)$")
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}  # fmt: skip


def _filter(condition: str, scanner: _Steps) -> PathStep:
    found = _COMPARE.match(condition)
    if found is None:
        path = parse_path(condition)
        return lambda value: (i for i in _items(value) if path.find(i))
    path, op, raw = parse_path(found.group(1)), _OPS[found.group(2)], found.group(3).strip()
    wanted: Any = raw[1:-1] if raw[:1] in ("'", '"') and raw[-1:] == raw[:1] else None
    if wanted is None:
        try:
            wanted = float(raw)
        except ValueError:
            raise scanner.fail(f"{raw!r} is neither a quoted string nor a number") from None

    def matches(item: Any) -> bool:
        for got in path.find(item):
            try:
                if op(got, wanted):
                    return True
            except TypeError:  # a number against a string: no match, as in kubectl
                continue
        return False

    return lambda value: (i for i in _items(value) if matches(i))


def _items(value: Any) -> list[Any]:
    if isinstance(value, list):
        return value
    return list(value.values()) if isinstance(value, dict) else []


@dataclass(frozen=True)
class Column:
    header: str
    path: Path


def parse_columns(text: str) -> tuple[Column, ...]:
    """``NAME:.path,OTHER:{.path}``: kubectl's ``-o custom-columns`` spec."""
    columns = []
    for part in _split_columns(text):
        header, colon, path = part.partition(":")
        if not colon or not header.strip() or not path.strip():
            raise TemplateError(
                f"custom-columns {text!r}: {part!r} must look like HEADER:.path (e.g. ID:.id)"
            )
        columns.append(Column(header.strip(), parse_path(path.strip())))
    return tuple(columns)


def _split_columns(text: str) -> list[str]:
    """On commas outside brackets and quotes (a filter may hold one)."""
    parts, depth, quote, start = [], 0, "", 0
    for at, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:at])
            start = at + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()] or [text]


def cell(column: Column, item: Any) -> str:
    """A custom column's cell: the values joined by commas, ``<none>`` for none."""
    found = column.path.find(item)
    return ",".join(show(v) for v in found) if found else "<none>"


def sort_key(path: Path, item: Any) -> tuple[int, Any]:
    """``--sort-by``: items by the first value the path names (numbers before strings,
    missing values last)."""
    found = path.find(item)
    if not found:
        return (3, "")
    value = found[0]
    if isinstance(value, bool):
        return (0, int(value))
    if isinstance(value, int | float):
        return (0, value)
    if isinstance(value, str):
        return (1, value)
    return (2, show(value))


SHAPES = ("jsonpath", "custom-columns")
"""The ``-o`` formats that take a template after ``=``: what they print is the objects of
``-o json`` reshaped."""


class Shape:
    """``-o jsonpath=TEMPLATE`` or ``-o custom-columns=SPEC``. A list is shaped as kubectl
    shapes one: the template sees ``{"kind": "List", "items": [...]}``; each item is a
    row of the columns."""

    def __init__(self, spec: str, *, no_headers: bool = False) -> None:
        kind, _, text = spec.partition("=")
        if kind not in SHAPES or not text:
            raise TemplateError(f"{spec!r}: use jsonpath=TEMPLATE or custom-columns=SPEC")
        self.kind, self.no_headers = kind, no_headers
        self.template = Template(text) if kind == "jsonpath" else None
        self.columns = parse_columns(text) if kind == "custom-columns" else ()
        self.headed = False

    def text(self, obj: Any) -> str:
        """The whole output for ``obj`` (a list of objects, or one)."""
        if self.template is not None:
            value = {"kind": "List", "items": obj} if isinstance(obj, list) else obj
            return self.template.render(value)
        items = obj if isinstance(obj, list) else [obj]
        rows = [[cell(c, i) for c in self.columns] for i in items]
        headers = [c.header for c in self.columns]
        shown = rows if self.no_headers else [headers, *rows]
        widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
        return "".join(_line(r, widths) for r in shown)

    def streamed(self, obj: Any) -> str:
        """One object of a stream (``events tail``, ``--watch``): a template's text, or a
        row (the headers before the first one)."""
        if self.template is not None:
            return self.template.render(obj)
        headers = [c.header for c in self.columns]
        row = [cell(c, obj) for c in self.columns]
        widths = [max(len(h), len(v)) for h, v in zip(headers, row, strict=True)]
        head = "" if self.headed or self.no_headers else _line(headers, widths)
        self.headed = True
        return head + _line(row, widths)


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    padded = [c.ljust(w) for c, w in zip(cells[:-1], widths, strict=False)]
    return "   ".join([*padded, cells[-1]]) + "\n"
