"""Which ````name```` / ````dotted.name```` references in our docstrings name nothing.

A docstring's double-backticked identifier is a promise that the thing exists. One
resolves when it is:

- ``file.py``: a file of that name somewhere in the tree;
- ``module.name`` (``records.update_taints``, ``http.limits.load_json``), where ``module``
  ends the dotted name of one of our modules and is not a local name of the file: ``name``
  defined in that module (or package);
- ``name()``: a function, class or argument of ours (or a builtin);
- ``name``: a name our code defines (a function, class, argument, assignment, attribute
  set, keyword, an identifier string such as a JSON key) or imports, or a builtin;
- any other ``a.b``: each part such a name, or an attribute of a module (or of a class in
  it) that our code imports.

Metric names are checked without the ``dynamod_`` prefix and ``_total`` suffix, setting
names without ``DYNAMO_``. ``EXTERNAL`` lists the words that are another program's (vLLM,
which the dev venv lacks; shell tools; kernel settings) or plain prose.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import inspect
import keyword
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SCANNED = ("dynamod", "dynamoctl")
REFERENCE = re.compile(r"``([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(\(\))?``")
IDENTIFIER = re.compile(r"[A-Za-z_][\w-]*\Z")
EXTERNAL = frozenset(
    {
        # vLLM (not in the dev venv) and NVIDIA Dynamo
        "AsyncLLM", "from_engine_args", "RequestOutputKind", "DELTA", "num_cached_tokens",
        "dynamo", "common", "model_taints", "DynamoWorkerMetadata",
        # other programs, kernel settings, prose
        "DYN_FILE_KV",
        # PromQL, HTTP, ZeroMQ transports
        "increase", "histogram_quantile", "POST", "inproc", "pgm", "NaN",
        # aiohttp's and asyncio's, named where the module is not imported
        "LineTooLong", "cancelling",
        # other programs, kernel settings, prose
        "TypeAdapter", "awk", "ps", "bs", "git", "reuse", "a", "bc", "__mp_main__", "fs",
        "inotify", "max_user_instances", "max_user_watches", "watchfiles", "zone", "sha256",
        "LimitNOFILE", "EMFILE", "nr_open",
        "LIMITS",
    }
)  # fmt: skip


@dataclass
class Names:
    """What our code defines and imports."""

    modules: dict[str, set[str]] = field(default_factory=dict)  # dotted -> names in it
    local: dict[str, set[str]] = field(default_factory=dict)  # file -> names it binds itself
    ours: set[str] = field(default_factory=set)  # defined or imported by our code
    known: set[str] = field(default_factory=set)  # ours, and the imported modules' names
    callables: set[str] = field(default_factory=set)  # our functions, classes, arguments
    files: set[str] = field(default_factory=set)
    imports: dict[str, set[str]] = field(default_factory=dict)  # file -> names of what it imports
    imported: dict[str, set[str]] = field(default_factory=dict)  # file -> what it imports of ours


def python_files(
    root: Path, tops: tuple[str, ...], stubs: bool = False
) -> Iterator[tuple[str, Path]]:
    """Every ``.py`` file under ``tops`` (and ``.pyi``: the generated protobuf classes are
    declared only there)."""
    for top in tops:
        for path in sorted((root / top).rglob("*.py*" if stubs else "*.py")):
            if path.suffix in (".py", ".pyi"):
                yield path.relative_to(root).as_posix(), path


def _bound(tree: ast.AST) -> tuple[set[str], set[str], set[str]]:
    """(names bound here other than by import, names imported, what can be called: the
    functions, classes and arguments)."""
    own: set[str] = set()
    imported: set[str] = set()
    defs: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs.add(node.name)
        elif isinstance(node, ast.arg):
            own.add(node.arg)
            defs.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.alias):
            imported.update((node.asname or node.name).split("."))
        elif isinstance(node, ast.keyword) and node.arg:
            own.add(node.arg)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and IDENTIFIER.match(node.value)
        ):
            own.update({node.value, node.value.replace("-", "_")})
    return own, imported, defs


def _imports(tree: ast.AST) -> Iterator[str]:
    """The modules a file imports (absolute imports only), and ``from m import x`` as
    ``m.x`` too, in case ``x`` is a module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


@functools.cache
def _attributes(module_name: str) -> set[str]:
    """The attributes of an importable module, and of the classes and modules in it."""
    try:
        module = importlib.import_module(module_name)
    except Exception:  # not a module, or not importable here: no names
        return set()
    found = set(dir(module))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated attributes warn when read
        for name in dir(module):
            value = getattr(module, name, None)
            if inspect.isclass(value) or inspect.ismodule(value):
                found.update(dir(value))
    return found


def collect(root: Path, generated: tuple[str, ...]) -> Names:
    names = Names(ours=set(dir(builtins)) | set(keyword.kwlist) | EXTERNAL)
    names.callables |= names.ours
    external: set[str] = set()
    for rel, path in python_files(root, (*SCANNED, "tests", "bench", "scripts"), stubs=True):
        names.files.add(path.name)
        parts = rel.removesuffix(".pyi").removesuffix(".py").split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.ours.update(parts)
        if not rel.startswith(SCANNED):
            continue
        tree = ast.parse(path.read_text())
        own, imported, defs = _bound(tree)
        names.local[rel] = own | defs
        names.imported[rel] = imported
        names.ours |= own | imported | defs
        names.callables |= defs
        theirs = {m for m in _imports(tree) if not m.startswith(SCANNED)}
        external |= theirs
        names.imports[rel] = set().union(*map(_attributes, theirs))
        if rel.startswith(generated):
            continue
        for end in range(1, len(parts) + 1):
            names.modules.setdefault(".".join(parts[:end]), set()).update(own | defs)
    names.known = set(names.ours)
    for module in external:
        names.known |= _attributes(module)
    return names


def _module_names(names: Names, head: str) -> list[set[str]]:
    """The names of each of our modules whose dotted name ends with ``head``."""
    return [
        inside
        for dotted, inside in names.modules.items()
        if dotted == head or dotted.endswith("." + head)
    ]


def resolves(names: Names, where: str, reference: str, called: bool) -> bool:
    if reference.endswith(".py"):
        return reference in names.files
    parts = reference.split(".")
    head = parts[0]
    if all(p in EXTERNAL for p in parts):
        return True
    if head.startswith("dynamod_"):  # a metric
        return head.removesuffix("_total") in names.ours
    if head.startswith("DYNAMO_") and head.removeprefix("DYNAMO_").lower() in names.ours:
        return True
    if called:  # a function of ours, not a library's method of the same name
        return head in names.callables if len(parts) == 1 else all(p in names.known for p in parts)
    if len(parts) == 1:  # ours, or of a module this file imports
        return head in names.ours or head in names.imports.get(where, set())
    if not all(p in names.known for p in parts):
        return False
    if head in names.local.get(where, set()):
        return True  # a variable or argument of this file (``watch.lost()``)
    for end in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:end])
        holders = _module_names(names, prefix)
        if holders:
            return bool(_module_names(names, f"{prefix}.{parts[end]}")) or any(
                parts[end] in inside for inside in holders
            )
    return True


def stale(root: Path, generated: tuple[str, ...]) -> list[str]:
    """``file:line ``reference```` for every docstring reference that resolves to nothing."""
    names = collect(root, generated)
    found: list[str] = []
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for rel, path in python_files(root, SCANNED):
        if rel.startswith(generated):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, documented):
                continue
            doc = ast.get_docstring(node, clean=False) or ""
            found.extend(
                f"{rel}:{getattr(node, 'lineno', 1)} {match.group(0)}"
                for match in REFERENCE.finditer(doc)
                if not resolves(names, rel, match.group(1), bool(match.group(2)))
            )
    return found
