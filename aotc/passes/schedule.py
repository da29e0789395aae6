"""The schedule step: how each kernel runs on the target, decided once, after fusion.

Fusion decided what a kernel holds; this pass decides how it runs and records it in ``Kernel.plan``
(``aotc.ir.kernel.KernelPlan``): how many tasks its work may be split into, a conv's code path, a
GEMM's blocking (``aotc.ops.gemm_plan``), how many chunks a reduction with few outputs is cut into,
and the scratch and partial-result bytes all that needs. The memory planner sizes the workspace from
the plan and codegen writes what it says, so neither asks the other.
"""

from __future__ import annotations

from aotc.ir.graph import Graph
from aotc.ir.kernel import Kernel, KernelPlan
from aotc.ops import OPS
from aotc.ops import conv as conv_ops
from aotc.ops.conv import expand_depthwise
from aotc.ops.cost import node_flops
from aotc.ops.gemm_plan import matmul_spec, plan_gemm
from aotc.passes.memory import MAX_TASKS
from aotc.target import Target

# A task should have at least this much work (elements touched + flops): waking a thread costs a
# microsecond or two, about what this much work takes.
TASK_WORK = 1 << 14
# Split a reduction into chunks when it has fewer outputs than this; chunks hold at least CHUNK
# reduced elements, at most MAX_CHUNKS per output.
FEW_OUTPUTS = 16
CHUNK = 1 << 16
MAX_CHUNKS = 64
# The widest type a partial result is kept in (double, int64).
PARTIAL_BYTES = 8


def schedule(graph: Graph, target: Target) -> bool:
    """Give every kernel of ``graph`` its plan for ``target``."""
    for k in graph.kernels:
        k.plan = plan_kernel(k, target)
    return True


def plan_kernel(k: Kernel, target: Target) -> KernelPlan:
    tasks = max_tasks(k)
    if k.kind == "loop":
        chunks = reduction_chunks(k)
        partials = 0 if k.reduce is None or chunks == 1 else k.reduce.outputs[0].size * chunks * PARTIAL_BYTES
        return KernelPlan(tasks, chunks=chunks, partials_bytes=partials)
    if k.kind == "gemm":
        assert k.gemm is not None
        spec = matmul_spec(k.gemm, target)
        gemm = None if spec is None else plan_gemm(spec)
        return KernelPlan(tasks, 0 if gemm is None else gemm.task_floats * 4, gemm=gemm)
    if k.kind == "conv":
        assert k.conv is not None
        g = conv_ops.geometry(k.conv)
        if k.expand is not None:
            floats = expand_depthwise.scratch_floats(conv_ops.geometry(k.expand), g, target)
            return KernelPlan(tasks, floats * 4, conv_path="expand_depthwise")
        path = conv_ops.conv_path(k.conv, target)
        return KernelPlan(tasks, conv_ops.conv_scratch_floats(g, path, target) * 4, conv_path=path)
    scratch = OPS[k.root.op].scratch
    return KernelPlan(tasks, 0 if scratch is None else scratch(k.root))


def max_tasks(k: Kernel) -> int:
    """How many tasks kernel ``k`` may be split into; 1 keeps a small kernel on the calling thread."""
    work = sum(node_flops(n) for n in k.nodes) + sum(v.size for v in (*k.inputs, *k.outputs))
    return max(1, min(MAX_TASKS, work // TASK_WORK))


def reduction_chunks(k: Kernel) -> int:
    """How many chunks each output of ``k``'s reduction is split into; 1: not split. The number
    depends on the sizes alone, so the bits of the result never depend on the thread count."""
    red = k.reduce
    if red is None:
        return 1
    n_out = red.outputs[0].size
    if n_out == 0 or n_out >= FEW_OUTPUTS:
        return 1
    return max(1, min(MAX_CHUNKS, red.inputs[0].size // n_out // CHUNK))
