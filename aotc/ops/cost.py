"""Cost estimates of nodes and kernels (arithmetic, bytes read): what the task split (aotc/codegen/
library.py) and the dumps' summaries (aotc/dump.py) weigh."""

from __future__ import annotations

from aotc.ir.graph import Node, Value
from aotc.ir.kernel import Kernel
from aotc.ops.registry import OPS

# Ops that only move data: they cost bytes, not arithmetic.
_DATA_MOVEMENT = {"Copy", "Concat", "Identity"}


def node_flops(n: Node) -> int:
    """Estimated arithmetic of one node: 2*M*N*K*batch for products, one per element otherwise.

    Reductions count their input elements; views, aliases and copies only move data (0).
    """
    op = OPS.get(n.op)
    kind = op.kind if op is not None else "kernel"
    out = n.outputs[0] if n.outputs else None
    if out is None or out.shape is None or n.op in _DATA_MOVEMENT or kind in ("alias", "view", "static"):
        return 0
    a = n.inputs[0] if n.inputs else None
    if n.op in ("MatMul", "Gemm") and a is not None and a.shape:
        k = a.shape[0] if n.op == "Gemm" and n.attr("transA", 0) else a.shape[-1]
        return 2 * out.size * int(k)
    if kind == "reduce" and a is not None and a.shape is not None:
        return a.size
    if n.op in ("Attention", "ai.onnx.preview.FlexAttention") and len(n.inputs) > 1:
        k = n.inputs[1]  # each output element is a dot over the keys' sequence, once for Q.K, once for P.V
        if k is not None and k.shape is not None and len(k.shape) >= 2:
            seq = k.shape[-2] if len(k.shape) == 4 else k.shape[1]
            return 4 * out.size * int(seq)
    return sum(v.size for v in n.outputs if v.shape is not None)


def kernel_reads(k: Kernel) -> list[Value]:
    """The kernel's inputs that it really reads at run time.

    Compile-time arguments (a Reduce's axes, a Reshape's shape) are baked into the C code, so they
    cost no memory traffic.
    """
    data = {id(v) for n in k.nodes for i, v in enumerate(n.inputs)
            if v is not None and (n.op not in OPS or i not in OPS[n.op].const_inputs)}
    return [v for v in k.inputs if id(v) in data]
