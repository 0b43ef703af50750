"""Regenerate every generated file, or check that the committed ones are fresh.

    python -m scripts.generate          # rewrite them
    python -m scripts.generate --check  # exit 1 and name the stale ones

Generated here: the protobuf / gRPC stubs (dynamod/api/v1, typed with mypy-protobuf), the
shell completions (completions/), the generated parts of the man pages (man/) and the
command tree dynamoctl answers --help and Tab from without typer (dynamoctl/generated/).
"""

from __future__ import annotations

import argparse
import difflib
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
BIN = Path(sys.executable).parent


def generate_stubs(out: Path) -> dict[str, str]:
    """Run protoc over proto/ into ``out``; return {relative path: content}."""
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"--plugin=protoc-gen-mypy={BIN / 'protoc-gen-mypy'}",
            f"--plugin=protoc-gen-mypy_grpc={BIN / 'protoc-gen-mypy_grpc'}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            f"--mypy_out={out}",
            f"--mypy_grpc_out={out}",
            *protos,
        ],
        check=True,
        cwd=ROOT,
    )  # fmt: skip
    files = {str(p.relative_to(out)): p.read_text() for p in out.rglob("*.py*") if p.is_file()}
    files["dynamod/api/v1/__init__.py"] = '"""Generated protobuf and gRPC stubs: do not edit."""\n'
    return files


def generated() -> dict[str, str]:
    from dynamoctl import coercion, shells
    from dynamoctl.app import command
    from scripts import docs

    with tempfile.TemporaryDirectory() as tmp:
        stubs = generate_stubs(Path(tmp))
    coercion.install()  # as dynamoctl runs: the snapshot must match what it prints
    return {**stubs, **docs.generated(), **shells.snapshot(command())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if any file is stale")
    args = parser.parse_args()
    stale = []
    for rel, content in sorted(generated().items()):
        path = ROOT / rel
        current = path.read_text() if path.exists() else None
        if current == content:
            continue
        if args.check:
            stale.append(rel)
            diff = difflib.unified_diff(
                (current or "").splitlines(),
                content.splitlines(),
                rel,
                rel + " (fresh)",
                lineterm="",
            )
            print("\n".join(list(diff)[:20]), file=sys.stderr)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            print(f"wrote {rel}")
    if stale:
        print(
            f"stale generated files: {', '.join(stale)}; run python -m scripts.generate",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
