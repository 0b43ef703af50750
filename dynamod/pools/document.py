"""A policy document read into one value, bounded in work as well as in bytes.

``load`` takes at most ``MAX_POLICY_BYTES`` (checked by the caller, before this) and
refuses, with a ``PoolPolicyError`` and before any value is built:

* YAML whose node graph nests deeper than ``MAX_DEPTH``, uses more than ``MAX_ALIASES``
  aliases, holds a recursive alias, or would expand to more than ``MAX_VALUES`` values
  (an alias bomb of a few hundred bytes expands to hundreds of millions); the graph is
  composed by libyaml's C parser (``yaml.CSafeLoader``) and measured with each shared node
  counted once, so measuring costs what the document's bytes cost;
* JSON nesting deeper than ``MAX_DEPTH`` (scanned before ``json.loads``, so a 30,000-level
  document is a refusal, never a ``RecursionError``).

YAML plain scalars read as YAML 1.2 floats too: ``1e308`` and ``5e-324`` are numbers (PyYAML's
YAML 1.1 rules need a dot and would read them as strings). ``brief`` shows a value in a
message: a bounded prefix built without expanding it or ``repr``-ing the whole.

This runs in a worker thread (``operations``), never on the event loop.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

import yaml

from dynamod.errors import PoolPolicyError

MAX_DEPTH: Final = 32
"""Nesting levels of a document (a policy needs 3: the document, ``pools``, a weight)."""
MAX_ALIASES: Final = 64
"""YAML aliases (``*name``) in one document."""
MAX_VALUES: Final = 50_000
"""Values a YAML document may expand to, aliases expanded (64 KiB of plain YAML holds
fewer than 33,000)."""

_FLOAT_12: Final = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$")
_JSON_TOKEN: Final = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)

_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_Base):  # type: ignore[misc]
    """``yaml.CSafeLoader`` refusing a mapping that repeats a key (PyYAML keeps the last one
    silently; a document that says two things must say one), with YAML 1.2 floats."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str | int | float | bool) and key in seen:
                raise PoolPolicyError(
                    f"policy: key {brief(key)} appears twice in one mapping (line "
                    f"{key_node.start_mark.line + 1})"
                )
            seen.add(key)
        result: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return result


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+.0123456789"))


def load(text: str) -> object:
    """The document's one value; JSON when it starts with ``{``, YAML otherwise."""
    if text.lstrip().startswith("{"):
        return _load_json(text)
    return _load_yaml(text)


def _load_json(text: str) -> object:
    depth = deepest = 0
    for match in _JSON_TOKEN.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_DEPTH:
                    raise PoolPolicyError(
                        f"policy: the document nests deeper than {MAX_DEPTH} levels "
                        f"(at character {match.start()}); a policy needs 3"
                    )
        elif token in "]}":
            depth -= 1
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs)
    except PoolPolicyError:
        raise  # a repeated key: already said in our words
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, too many digits
        raise PoolPolicyError(f"policy: the document is not valid JSON: {exc}") from None


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise PoolPolicyError(f"policy: key {brief(key)} appears twice in one mapping")
        out[key] = value
    return out


def _load_yaml(text: str) -> object:
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _measure(node)
        return loader.construct_document(node)
    except PoolPolicyError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}" if mark else ""
        raise PoolPolicyError(
            f"policy: the document is not valid YAML: {exc.problem}{where}"
        ) from None
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as exc:
        raise PoolPolicyError(f"policy: the document is not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def _measure(root: yaml.Node) -> None:
    """Refuse a node graph too deep, too aliased or too large once expanded. Each node is
    visited once (a shared node is an alias): its expanded size is remembered."""
    size: dict[int, int] = {}
    open_: set[int] = set()
    aliases = 0
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        ident = id(node)
        if done:
            open_.discard(ident)
            size[ident] = 1 + sum(size[id(c)] for c in _children(node))
            if size[ident] > MAX_VALUES:
                raise PoolPolicyError(
                    f"policy: the document expands to more than {MAX_VALUES} values through "
                    f"its aliases (line {node.start_mark.line + 1}); write it out instead"
                )
            continue
        if ident in open_:
            raise PoolPolicyError(
                f"policy: the document holds a recursive alias (line "
                f"{node.start_mark.line + 1}); a policy is a tree"
            )
        if depth > MAX_DEPTH:
            raise PoolPolicyError(
                f"policy: the document nests deeper than {MAX_DEPTH} levels (line "
                f"{node.start_mark.line + 1}); a policy needs 3"
            )
        if ident in size:
            aliases += 1
            if aliases > MAX_ALIASES:
                raise PoolPolicyError(
                    f"policy: the document uses more than {MAX_ALIASES} aliases (line "
                    f"{node.start_mark.line + 1})"
                )
            continue
        if not isinstance(node, yaml.CollectionNode):
            size[ident] = 1
            continue
        open_.add(ident)
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in _children(node))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def brief(value: object, limit: int = 200) -> str:
    """``value`` as a message shows it: its repr up to about ``limit`` characters, built
    piece by piece so a huge or deeply shared value is never expanded or repr-ed whole."""
    out: list[str] = []
    budget = [limit]

    def put(text: str) -> bool:
        out.append(text[: budget[0]])
        budget[0] -= len(text)
        return budget[0] > 0

    def walk(item: object, depth: int) -> bool:
        if depth > 8:
            return put("...")
        if isinstance(item, dict):
            if not put("{"):
                return False
            for i, (key, val) in enumerate(item.items()):
                if (i and not put(", ")) or not walk(key, depth + 1) or not put(": "):
                    return False
                if not walk(val, depth + 1):
                    return False
            return put("}")
        if isinstance(item, list | tuple):
            if not put("["):
                return False
            for i, val in enumerate(item):
                if (i and not put(", ")) or not walk(val, depth + 1):
                    return False
            return put("]")
        if isinstance(item, str) and len(item) > limit:
            return put(repr(item[:limit]))
        if isinstance(item, int) and item.bit_length() > 256:
            return put(f"<an integer of {item.bit_length()} bits>")
        return put(repr(item))

    complete = walk(value, 0)
    text = "".join(out)
    return text if complete else f"{text}... (cut at {limit} characters)"
