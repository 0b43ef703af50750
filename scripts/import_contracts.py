"""The import contract import-linter has no type for: an allow-list.

``allow_list``: every module of ``source`` may import, of the package ``within``, only the
package itself (its ``__init__``: the version) and the modules listed in ``allowed`` (each
with what lies under it). Anything else it imports
there, directly, breaks the contract, naming the importer, the module and the line. What
the allowed modules import in turn is theirs to answer for (their own layer contract):
this is the boundary of one package, as a list of doors rather than of walls.

Registered in ``pyproject.toml`` (``[tool.importlinter] contract_types``); ``lint-imports``
runs it with the others.
"""

from __future__ import annotations

from typing import Any

from grimp import ImportGraph
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


class AllowListContract(Contract):
    type_name = "allow_list"

    source = fields.StringField()
    within = fields.StringField()
    allowed = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        source, within = str(self.source), str(self.within)
        allowed = [str(module) for module in self.allowed]  # type: ignore[attr-defined]
        refused: list[dict[str, Any]] = []
        for importer in sorted(graph.find_descendants(source) | {source}):
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                if imported == within or not _inside(imported, within):
                    continue
                if not any(_inside(imported, a) for a in allowed):
                    details = graph.get_import_details(importer=importer, imported=imported)
                    lines = [d["line_number"] for d in details]
                    refused.append({"importer": importer, "imported": imported, "lines": lines})
        return ContractCheck(kept=not refused, metadata={"refused": refused, "allowed": allowed})

    def render_broken_contract(self, check: ContractCheck) -> None:
        allowed = ", ".join(check.metadata["allowed"])
        output.print_error(f"{self.source} may import only these of {self.within}: {allowed}")
        output.new_line()
        for item in check.metadata["refused"]:
            where = ", ".join(f"l.{n}" for n in item["lines"])
            output.print_error(f"{item['importer']} -> {item['imported']} ({where})", bold=False)
        output.new_line()


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")
