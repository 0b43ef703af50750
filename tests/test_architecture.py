"""ARCHITECTURE.md is held to the code: a map that names a module that is gone, or leaves
out one that exists, or draws layers the import contract does not enforce, fails here.

- every path it names (in backticks or in its diagrams) exists;
- its layer table is, row by row, the ``layers`` contract in ``pyproject.toml``, and the
  layers name every top-level module and package of ``dynamod``;
- every module of ``dynamod/`` and ``dynamoctl/`` is named in *Every module*, under its
  own package;
- the README's *Layout* names only directories that exist;
- a path to one of our modules in any docstring, comment or document
  (``router/saturation.py``) names a file that exists: a rename leaves none behind;
- a ````name```` or ````dotted.name```` in a docstring of ``dynamod/`` or ``dynamoctl/``
  names something that exists (``tests/support/docrefs.py`` says how one resolves).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.support import docrefs

ROOT = Path(__file__).resolve().parent.parent
MAP = (ROOT / "ARCHITECTURE.md").read_text()
GENERATED = ("dynamod/api/v1/", "dynamoctl/generated/")
TOP = ("dynamod/", "dynamoctl/", "tests/", "scripts/", "bench/", "proto/", "man/", "completions/")


def section(text: str, title: str) -> str:
    """The text under ``## title`` up to the next ``## ``."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no section '## {title}'"
    return match.group(1)


def ticked(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def repo_files() -> list[str]:
    return [
        p.relative_to(ROOT).as_posix()
        for top in TOP
        for p in (ROOT / top).rglob("*")
        if "__pycache__" not in p.parts
    ]


def modules() -> list[str]:
    """Every hand-written module of the two packages, relative to the root."""
    return sorted(
        path
        for path in repo_files()
        if path.startswith(("dynamod/", "dynamoctl/"))
        and path.endswith(".py")
        and not path.endswith(("/__init__.py", "/__main__.py"))
        and not path.startswith(GENERATED)
    )


def test_every_path_named_exists() -> None:
    files = repo_files()
    named = set()
    for token in ticked(MAP):
        token = token.split(" ")[0].rstrip(":")
        if token.startswith(TOP) or re.fullmatch(r"[\w/]+\.py", token):
            named.add(token)
    for block in re.findall(r"^```\n(.*?)^```", MAP, re.M | re.S):
        named.update(re.findall(r"[\w/]+\.py", block))
    missing = []
    for path in sorted(named):
        exact = path.startswith(TOP)
        found = (ROOT / path).exists() if exact else any(f.endswith("/" + path) for f in files)
        if not found:
            missing.append(path)
    assert not missing, f"ARCHITECTURE.md names paths that do not exist: {missing}"


def test_dotted_modules_named_exist() -> None:
    dotted = {t for t in ticked(MAP) if re.fullmatch(r"dynamod(\.\w+)+", t)}
    missing = [
        name
        for name in sorted(dotted)
        if not (ROOT / (name.replace(".", "/") + ".py")).exists()
        and not (ROOT / name.replace(".", "/") / "__init__.py").exists()
    ]
    assert dotted and not missing, f"ARCHITECTURE.md names modules that do not exist: {missing}"


def layer_rows() -> list[list[str]]:
    """The layer table's modules, row by row; ``then`` splits a row into two layers."""
    rows: list[list[str]] = []
    for line in section(MAP, "Layers").splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if len(cells) < 3 or not cells[1].startswith("`"):
            continue
        rows.extend(sorted(re.findall(r"`(\w+)`", part)) for part in cells[1].split(", then "))
    return rows


def contract_rows() -> list[list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [c for c in contracts if c["type"] == "layers"]
    return [sorted(re.split(r"\s*[|:]\s*", row)) for row in layers["layers"]]


def test_layer_table_is_the_import_contract() -> None:
    assert layer_rows() == contract_rows()


def test_layers_name_every_top_level_module() -> None:
    package = ROOT / "dynamod"
    top = {p.stem for p in package.glob("*.py") if not p.name.startswith("__")}
    top |= {p.name for p in package.iterdir() if (p / "__init__.py").exists()}
    layered = {name for row in layer_rows() for name in row}
    assert layered == top, (
        f"in no layer: {sorted(top - layered)}; layered but absent: {sorted(layered - top)}"
    )


def paragraphs(text: str) -> dict[str, str]:
    """*Every module*'s text by the package it is about: a paragraph opening with
    `` `dynamod/x/` `` is about ``dynamod/x/``; the table under `` `dynamod/` `` is about
    ``dynamod/``."""
    about: dict[str, str] = {}
    for block in re.split(r"\n\s*\n", text):
        match = re.match(r"`((?:dynamod|dynamoctl)/(?:\w+/)*)`", block.strip())
        if match:
            current = match.group(1)
            about[current] = about.get(current, "") + block
        elif about:
            about[current] += block
    return about


@pytest.mark.parametrize("module", modules())
def test_every_module_is_named_under_its_package(module: str) -> None:
    about = paragraphs(section(MAP, "Every module"))
    owners = [p for p in about if module.startswith(p)]
    assert owners, f"{module}: no paragraph of *Every module* is about its package"
    owner = max(owners, key=len)
    rest = module.removeprefix(owner).split("/")
    names = set(ticked(about[owner]))
    needed = [d + "/" for d in rest[:-1]] + [rest[-1]]
    absent = [n for n in needed if n not in names]
    assert not absent, f"{module}: *Every module* under `{owner}` does not name {absent}"


def test_readme_layout_names_what_exists() -> None:
    layout = section((ROOT / "README.md").read_text(), "Layout")
    (block,) = re.findall(r"^```\n(.*?)^```", layout, re.M | re.S)
    named = re.findall(r"^(\S+/)\s", block, re.M)
    assert named, "the README's Layout names no directory"
    missing = [d for d in named if not (ROOT / d).is_dir()]
    assert not missing, f"the README's Layout names directories that do not exist: {missing}"


def our_directories() -> set[str]:
    return {p.name for top in TOP for p in (ROOT / top).rglob("*") if p.is_dir()} | {
        top.rstrip("/") for top in TOP
    }


def test_every_path_to_our_modules_resolves() -> None:
    files = repo_files()
    ours = our_directories()
    texts = [ROOT / "README.md", ROOT / "ARCHITECTURE.md"] + [
        ROOT / f for f in files if f.endswith((".py", ".md")) and not f.startswith(GENERATED)
    ]
    stale = []
    for text in texts:
        body = text.read_text(errors="replace")
        for ref in re.findall(r"(?<![\w./-])((?:\w+/)+\w+\.py)\b", body):
            if ref.split("/")[0] not in ours:
                continue  # another project's file (aiohttp/web_protocol.py)
            if not any(f == ref or f.endswith("/" + ref) for f in files):
                stale.append(f"{text.relative_to(ROOT)}: {ref}")
    assert not stale, f"paths to modules that do not exist: {stale}"


@pytest.fixture(scope="module")
def names() -> docrefs.Names:
    return docrefs.collect(ROOT, GENERATED)


def test_every_docstring_reference_names_something() -> None:
    stale = docrefs.stale(ROOT, GENERATED)
    assert not stale, "docstrings name what does not exist:\n" + "\n".join(stale)


@pytest.mark.parametrize(
    ("where", "reference", "called"),
    [
        ("dynamod/worker/writer.py", "records.update_taints", False),  # it is in discovery
        ("dynamod/http/limits.py", "load_json", False),  # jsoncodec.read now
        ("dynamod/http/openai.py", "http.limits.dump_json", False),
        ("dynamoctl/targets.py", "scope", True),  # click has a scope(); we do not
        ("dynamod/router/fit.py", "records.NO_SUCH_NAME", False),
    ],
)
def test_a_reference_to_a_name_that_is_gone_is_found(
    names: docrefs.Names, where: str, reference: str, called: bool
) -> None:
    assert not docrefs.resolves(names, where, reference, called)


@pytest.mark.parametrize(
    ("where", "reference", "called"),
    [
        ("dynamod/worker/writer.py", "discovery.updates.update_taints", False),
        ("dynamod/http/limits.py", "jsoncodec.MAX_DEPTH", False),
        ("dynamoctl/targets.py", "target", True),
        ("dynamod/store/base.py", "watch.lost", True),  # an argument's method
        ("dynamod/tasks.py", "asyncio.TaskGroup", False),
        ("dynamod/router/fit.py", "fit.py", False),
    ],
)
def test_a_reference_to_what_exists_resolves(
    names: docrefs.Names, where: str, reference: str, called: bool
) -> None:
    assert docrefs.resolves(names, where, reference, called)


def test_the_map_states_dynamoctls_allow_list_as_pyproject_has_it() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (allow,) = [c for c in contracts if c["type"] == "allow_list"]
    allowed = {m.removeprefix("dynamod.") for m in allow["allowed"]}
    text = MAP[MAP.index("**dynamoctl's allow-list**") :]
    end = re.search(r"any other\s+import", text)
    assert end, "the allow-list's paragraph does not end with 'any other import'"
    text = text[: end.start()]
    stated = {t.removeprefix("dynamod.") for t in ticked(text) if "/" not in t} - {"dynamod"}
    assert stated == allowed, (
        f"ARCHITECTURE.md states {sorted(stated)}, pyproject allows {sorted(allowed)}"
    )
