"""Kernels: the unit of generated code. The fusion pass (aotc/passes/fuse.py) decides which nodes a
kernel holds, the schedule step (aotc/passes/schedule.py) how it runs on the target (its ``KernelPlan``);
the memory planner sizes its scratch from the plan and codegen writes it as one C function
(aotc/codegen/kernels.py) following the plan."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aotc.ir.graph import Node, Value

if TYPE_CHECKING:
    from aotc.ops.gemm_plan import GemmPlan


@dataclass(frozen=True)
class KernelPlan:
    """How one kernel runs on its target, decided once, before memory planning and codegen."""

    tasks: int = 1               # the most tasks its work is split into (1: it runs on the calling thread)
    scratch_bytes: int = 0       # per-task scratch (packing buffers, padded planes); one slot per thread
    chunks: int = 1              # loop kernels: chunks each output of the reduction is split into
    partials_bytes: int = 0      # loop kernels: the chunks' partial results, one buffer its tasks share
    conv_path: str | None = None  # conv kernels: "winograd", "rows", "tiled", "depthwise", "generic",
    #                               or "expand_depthwise" (a depthwise conv computing its 1x1 input)
    gemm: GemmPlan | None = None  # gemm kernels: the GEMM template's blocking; None: the naive loop

    def describe(self) -> str:
        """One line for the dumps."""
        parts = ["one task" if self.tasks == 1 else f"up to {self.tasks} tasks"]
        if self.conv_path:
            parts.append(f"conv {self.conv_path}")
        if self.gemm is not None:
            parts.append(self.gemm.describe())
        if self.chunks > 1:
            parts.append(f"{self.chunks} chunks per output ({self.partials_bytes} bytes of partials)")
        if self.scratch_bytes:
            parts.append(f"scratch {self.scratch_bytes} bytes per task")
        return "; ".join(parts)


@dataclass(eq=False)
class Kernel:
    kind: str                      # "loop" | "gemm" | "conv" | "op"
    root: Node                     # the node whose output the kernel writes
    nodes: list[Node] = field(default_factory=list)  # in graph order
    reduce: Node | None = None     # loop kernels: the one reduction, if any
    gemm: Node | None = None       # gemm kernels: the MatMul
    conv: Node | None = None       # conv kernels: the Conv
    expand: Node | None = None     # conv kernels: a 1x1 Conv computed inside, feeding ``conv``
    index: int = 0
    plan: KernelPlan | None = None  # set by the schedule step
    # The input whose buffer this kernel overwrites (an in-place update, Graph.add_update): its output
    # and that input share memory, each element read before it is written (passes/fuse.py).
    inplace: Value | None = None

    @property
    def outputs(self) -> list[Value]:
        return list(self.root.outputs)

    @property
    def inputs(self) -> list[Value]:
        """Values read from memory (produced outside the kernel), in first-use order."""
        inside = {id(n) for n in self.nodes}
        seen: set[int] = set()
        res = []
        for n in self.nodes:
            for v in n.inputs:
                if v is None or id(v) in seen:
                    continue
                if v.is_const or v.producer is None or id(v.producer) not in inside:
                    seen.add(id(v))
                    res.append(v)
        return res

    @property
    def ops(self) -> list[str]:
        return [n.op for n in self.nodes]

    @property
    def name(self) -> str:
        # Op keys are registry names (never model text); a domain prefix ("ai.onnx.ml.") is dropped.
        label = "_".join(dict.fromkeys(op.rpartition(".")[2].lower() for op in self.ops))[:48]
        return f"k{self.index}_{label}"
