"""The import graph of aotc's packages, drawn from the code: which package imports which.

Reads every module under aotc/ with ``ast`` (nothing is imported) and collects its imports of other
aotc modules: at module level, and also those inside functions (a deferred import is still a
dependency, often one that hides a cycle). Imports under ``if TYPE_CHECKING:`` are left out: they
exist for the type checker only. Prints Graphviz dot (default) or mermaid text of the package graph;
``--modules`` lists the module-level edges instead.

    python tools/import_graph.py > docs/images/imports.dot
    dot -Tsvg docs/images/imports.dot -o docs/images/imports.svg
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "aotc"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """The aotc modules ``module`` imports (relative imports resolved)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "aotc")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "aotc":
                found.add(target)
                found.update(f"{target}.{a.name}" for a in node.names)  # `from aotc.ops import conv`
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def module_edges(root: Path = ROOT) -> dict[str, set[str]]:
    """Each aotc module and the aotc modules it imports (names that are not modules are dropped)."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    edges = {}
    for mod, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = _imports(tree, mod, path.name == "__init__.py")
        edges[mod] = {t for t in targets if t in files and t != mod}
    return edges


def unit(module: str) -> str:
    """The part of aotc a module belongs to: its subpackage (aotc.ops), or itself if top-level."""
    parts = module.split(".")
    return ".".join(parts[:2])


def package_edges(root: Path = ROOT) -> dict[str, set[str]]:
    """The graph between the parts of aotc (subpackages and top-level modules)."""
    res: dict[str, set[str]] = {}
    for mod, targets in module_edges(root).items():
        src = unit(mod)
        res.setdefault(src, set())
        res[src].update(unit(t) for t in targets if unit(t) != src)
    res.pop("aotc", None)  # the package's __init__ re-exports the public API
    for targets in res.values():
        targets.discard("aotc")
    return res


def dot(edges: dict[str, set[str]]) -> str:
    lines = ["digraph aotc {", "  rankdir=LR;", '  node [shape=box, fontname="Helvetica"];']
    lines += [f'  "{n[5:]}";' for n in sorted(edges)]
    lines += [f'  "{a[5:]}" -> "{b[5:]}";' for a in sorted(edges) for b in sorted(edges[a])]
    return "\n".join([*lines, "}"]) + "\n"


def mermaid(edges: dict[str, set[str]]) -> str:
    lines = ["graph LR"]
    lines += [f"  {a[5:]} --> {b[5:]}" for a in sorted(edges) for b in sorted(edges[a])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--format", choices=["dot", "mermaid"], default="dot")
    ap.add_argument("--modules", action="store_true", help="list module-level edges, one per line")
    args = ap.parse_args(argv)
    if args.modules:
        for mod, targets in module_edges().items():
            for t in sorted(targets):
                print(f"{mod} -> {t}")
        return 0
    edges = package_edges()
    sys.stdout.write(dot(edges) if args.format == "dot" else mermaid(edges))
    return 0


if __name__ == "__main__":
    sys.exit(main())
