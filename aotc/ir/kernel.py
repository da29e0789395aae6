"""Kernels: the unit of generated code. The fusion pass (aotc/passes/fuse.py) decides which nodes a
kernel holds; codegen writes each as one C function (aotc/codegen/kernels.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from aotc.ir.graph import Node, Value


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
    # The input whose buffer this kernel overwrites (an in-place update, Graph.add_update): its output
    # and that input share memory, each element read before it is written (passes/fuse.py).
    inplace: Value | None = None
    plan: KernelPlan | None = None  # set by the schedule step

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
