"""aotc's parts import downward only: the IR knows no ops, the ops no passes, and nothing below codegen
imports codegen, the build or the bindings (tools/import_graph.py reads the imports, deferred ones too)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from import_graph import module_edges, package_edges, unit  # noqa: E402

# What each part must not import: the parts above it in frontends/ir -> ops -> passes -> codegen -> build
# -> bindings -> compiler -> cli.
ABOVE = {
    "aotc.ir": {"aotc.ops", "aotc.passes", "aotc.codegen", "aotc.build", "aotc.bindings", "aotc.compiler",
                "aotc.frontends", "aotc.cli"},
    "aotc.ops": {"aotc.passes", "aotc.codegen", "aotc.build", "aotc.bindings", "aotc.compiler", "aotc.frontends",
                 "aotc.cli"},
    "aotc.passes": {"aotc.codegen", "aotc.build", "aotc.bindings", "aotc.compiler", "aotc.frontends", "aotc.cli"},
    "aotc.codegen": {"aotc.build", "aotc.bindings", "aotc.compiler", "aotc.frontends", "aotc.cli"},
    "aotc.frontends": {"aotc.codegen", "aotc.build", "aotc.bindings", "aotc.compiler", "aotc.cli"},
    "aotc.target": {"aotc.ir", "aotc.ops", "aotc.passes", "aotc.codegen", "aotc.build", "aotc.bindings"},
    "aotc.isa": {"aotc.ir", "aotc.ops", "aotc.passes", "aotc.codegen", "aotc.build", "aotc.bindings"},
    # Read by the passes (the config prunes, the dumps are written between passes): at the level of the ops.
    "aotc.config": {"aotc.ops", "aotc.passes", "aotc.codegen", "aotc.build", "aotc.bindings", "aotc.compiler",
                    "aotc.frontends", "aotc.cli"},
    "aotc.dump": {"aotc.passes", "aotc.codegen", "aotc.build", "aotc.bindings", "aotc.compiler", "aotc.frontends",
                  "aotc.cli"},
}


def upward() -> set[tuple[str, str]]:
    return {(mod, t) for mod, targets in module_edges().items() for t in targets
            if unit(t) in ABOVE.get(unit(mod), set())}


def test_no_module_imports_upward() -> None:
    assert not upward(), sorted(upward())


def test_the_graph_reads_deferred_and_relative_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "aotc"
    (pkg / "ops").mkdir(parents=True)
    (pkg / "codegen").mkdir()
    for f in ("__init__.py", "ops/__init__.py", "codegen/__init__.py", "codegen/names.py"):
        (pkg / f).write_text("")
    (pkg / "ops" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from aotc.codegen import names\n"
        "def f():\n    from ..codegen import names\n    return names\n")
    assert module_edges(pkg)["aotc.ops.a"] == {"aotc.codegen", "aotc.codegen.names"}
    assert package_edges(pkg)["aotc.ops"] == {"aotc.codegen"}
    (pkg / "ops" / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                      "    from aotc.codegen import names\n")
    assert module_edges(pkg)["aotc.ops.a"] == set()
