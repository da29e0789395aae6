"""Matrix products. Gemm is rewritten into MatMul plus elementwise ops by the simplifier, so MatMul
is the one op the GEMM template kernel implements (with its epilogue fused by the fusion pass)."""

from __future__ import annotations

from aotc.errors import AotcError
from aotc.ir.graph import Node
from aotc.ops.common import broadcast_shapes
from aotc.ops.registry import OpDef, register


def matmul_shape(a: tuple[int, ...], b: tuple[int, ...], where: str) -> tuple[int, ...]:
    """numpy.matmul's result shape (1-D operands promoted, batch dims broadcast)."""
    if not a or not b:
        raise AotcError(f"{where}: MatMul operands must have rank >= 1")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise AotcError(f"{where}: MatMul inner dimensions differ: {a} @ {b}")
    batch = broadcast_shapes(a2[:-2], b2[:-2], where=where)
    out = [*batch, a2[-2], b2[-1]]
    if len(b) == 1:
        out.pop(-1)
    if len(a) == 1:
        out.pop(-2 if len(b) != 1 else -1)
    return tuple(out)


def _matmul_infer(node: Node):
    a, b = node.inputs[0], node.inputs[1]
    assert a is not None and b is not None
    return [(matmul_shape(a.shape, b.shape, f"MatMul node {node.name!r}"), a.dtype)]


def _gemm_infer(node: Node):
    a, b = node.inputs[0], node.inputs[1]
    assert a is not None and b is not None
    m = a.shape[1] if node.attr("transA", 0) else a.shape[0]
    n = b.shape[0] if node.attr("transB", 0) else b.shape[1]
    return [((m, n), a.dtype)]


register(OpDef("MatMul", "gemm", _matmul_infer))
# Only lives until the simplifier rewrites it (fold and inference still need it).
register(OpDef("Gemm", "gemm", _gemm_infer))
