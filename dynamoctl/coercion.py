"""Plain value conversion for dynamoctl's parameters, so that running a command (or
completing one on Tab) does not import pydantic.

typer 0.29 converts every non-flag parameter through a pydantic ``TypeAdapter``; importing
pydantic costs about 120 ms, which is most of a ``dynamoctl workers ls`` and all of the
difference between a snappy and a sluggish Tab. Our parameters are only ``bool``, ``str``,
``int``, ``float``, ``Path`` and lists of those, so ``install()`` gives each such parameter a
conversion of its own. This reaches into typer's internals (``get_runtime_param``): if
they move, ``install`` leaves everything as typer built it — slower, never wrong — and
``tests/cli/test_startup.py`` says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

try:
    from typer._coercion import RuntimeParam
    from typer.core import _TyperParameter
except ImportError:  # another typer: keep its own conversion
    RuntimeParam = None  # type: ignore[assignment,misc]
    _TyperParameter = None  # type: ignore[assignment,misc]


def _number(kind: type[int] | type[float]) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        try:
            return kind(value)
        except (TypeError, ValueError):
            noun = "an integer" if kind is int else "a number"
            raise typer.BadParameter(f"{value!r} is not {noun}") from None

    return convert


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "t", "yes", "y", "on"):
        return True
    if text in ("0", "false", "f", "no", "n", "off", ""):
        return False
    raise typer.BadParameter(f"{value!r} is not a boolean (use true or false)")


CONVERTERS: dict[Any, Callable[[Any], Any]] = {
    bool: _bool,
    str: str,
    int: _number(int),
    float: _number(float),
    Path: Path,
}


def _converter(annotation: Any) -> tuple[Callable[[Any], Any], bool] | None:
    """(convert one value, is a list) for the annotations we handle, else None."""
    if annotation in CONVERTERS:
        return CONVERTERS[annotation], False
    if getattr(annotation, "__origin__", None) is list:
        (item,) = annotation.__args__
        if item in CONVERTERS:
            return CONVERTERS[item], True
    return None


if RuntimeParam is not None:

    @dataclass(frozen=True)
    class PlainParam(RuntimeParam):
        convert: Callable[[Any], Any]
        many: bool

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            if self.many:
                return [self.convert(v) for v in value]
            return self.convert(value)


def _plain(descriptor: Any) -> Any:
    """A ``PlainParam`` for a parameter we know how to convert, else None."""
    info = descriptor.parameter_info
    found = _converter(descriptor.annotation)
    if found is None or info.min is not None or info.max is not None or descriptor.is_file:
        return None
    convert, many = found
    return PlainParam(info, descriptor.annotation, convert, many)


def install() -> bool:
    """Make typer parameters convert plainly where they can; return whether it took.

    Patched on the class rather than per parameter because click creates the help option
    lazily, on first use. Idempotent; only dynamoctl's process runs it.
    """
    if RuntimeParam is None or _TyperParameter is None:
        return False
    original = getattr(_TyperParameter, "get_runtime_param", None)
    if original is None or getattr(original, "plain", False):
        return original is not None

    def get_runtime_param(self: Any) -> Any:
        if getattr(self, "_runtime_param", None) is None:
            self._runtime_param = _plain(self.type_descriptor)
        return original(self)

    get_runtime_param.plain = True  # type: ignore[attr-defined]
    _TyperParameter.get_runtime_param = get_runtime_param  # type: ignore[method-assign]
    return True
