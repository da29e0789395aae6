"""Runs named passes in order, verifying the graph after each and dumping it when asked.

A pass is a function ``Graph -> bool`` (changed or not), in the manner of XLA's HloPassPipeline; a pass
whose decisions depend on what the code is compiled for (fusion, the schedule) also takes the
``Target``, and says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aotc.dump import write_dumps, write_summary
from aotc.ir.graph import Graph
from aotc.passes.fuse import fuse, kernels_text
from aotc.passes.layout import optimize_layout
from aotc.passes.memory import plan_memory
from aotc.passes.patterns import rewrite_patterns
from aotc.passes.propagate import propagate
from aotc.passes.prune import prune
from aotc.passes.quantized import fuse_qdq
from aotc.passes.schedule import schedule
from aotc.passes.simplify import simplify
from aotc.passes.widen import widen_emulated
from aotc.target import Target, for_isa

PassFn = Callable[..., bool]


def simplify_to_fixpoint(graph: Graph) -> bool:
    """Simplify and re-infer until nothing changes: one rewrite often enables the next."""
    changed = False
    for _ in range(16):
        if not simplify(graph):
            break
        propagate(graph)
        changed = True
    return changed


@dataclass
class Pass:
    name: str
    run: PassFn                 # run(graph), or run(graph, target) when ``uses_target``
    uses_target: bool = False


DEFAULT_PASSES = [
    Pass("prune", prune),
    Pass("qdq", fuse_qdq),  # DequantizeLinear -> Conv -> QuantizeLinear -> QLinearConv, before weights fold
    Pass("propagate", propagate),   # shape/dtype inference + constant folding
    Pass("patterns", rewrite_patterns),  # decomposed LayerNorm / GELU -> one op each
    Pass("layout", optimize_layout),  # Transposes sunk until inverse pairs cancel (NHWC graphs)
    Pass("simplify", simplify_to_fixpoint),
    Pass("prune_again", prune),
    Pass("widen_emulated", widen_emulated),  # Casts around non-loop ops on bfloat16, float8, int4, ...
    Pass("fuse", fuse, uses_target=True),
    Pass("schedule", schedule, uses_target=True),  # each kernel's plan: tasks, conv path, GEMM blocking, ...
    Pass("plan_memory", plan_memory),
]


def run_passes(graph: Graph, passes: list[Pass] | None = None, dump_dir: Path | None = None,
               log: Callable[[str], None] | None = None, target: Target | None = None) -> Graph:
    """Run ``passes`` (the default pipeline) on ``graph`` for ``target`` (default: portable C kernels)."""
    passes = DEFAULT_PASSES if passes is None else passes
    target = target or for_isa("generic")
    if dump_dir is not None:
        dump_dir.mkdir(parents=True, exist_ok=True)
        (dump_dir / "00_imported.txt").write_text(graph.to_text())
    for i, p in enumerate(passes, start=1):
        if log:
            log(f"pass {p.name}")
        if dump_dir is not None and p.name == "fuse":
            write_dumps(graph, dump_dir, "graph_before_fusion")
        changed = p.run(graph, target) if p.uses_target else p.run(graph)
        graph.verify()
        if dump_dir is not None:
            text = graph.to_text()
            if graph.kernels:
                text += "\n" + kernels_text(graph)
            suffix = "" if changed else "  # unchanged"
            (dump_dir / f"{i:02d}_{p.name}.txt").write_text(f"# after {p.name}{suffix}\n" + text)
    if dump_dir is not None and graph.memory is not None:
        write_dumps(graph, dump_dir, "graph_after_fusion")
        write_summary(graph, dump_dir)
    return graph
