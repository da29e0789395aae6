"""Matrix products. Gemm is rewritten into MatMul plus elementwise ops by the simplifier, so MatMul
is the one op the GEMM template kernel implements (with its epilogue fused by the fusion pass)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from aotc.errors import AotcError
from aotc.ir.graph import Node, Value
from aotc.ops.common import broadcast_shapes
from aotc.ops.registry import OpDef, register

if TYPE_CHECKING:
    from aotc.target import Target


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
    if len(a.shape) != 2 or len(b.shape) != 2:  # onnxruntime refuses other ranks at load
        raise AotcError(f"Gemm node {node.name!r}: A {list(a.shape)} and B {list(b.shape)} must be matrices")
    (m, ka), (kb, n) = a.shape[::-1] if node.attr("transA", 0) else a.shape, \
        b.shape[::-1] if node.attr("transB", 0) else b.shape
    if ka != kb:
        raise AotcError(f"Gemm node {node.name!r}: A {list(a.shape)} and B {list(b.shape)} have inner "
                        f"dimensions {ka} and {kb}")
    c = node.inputs[2] if len(node.inputs) > 2 else None
    if c is not None and (len(c.shape) > 2 or any(d not in (1, full) for d, full in
                                                  zip(c.shape[::-1], (n, m), strict=False))):
        raise AotcError(f"Gemm node {node.name!r}: C {list(c.shape)} does not broadcast to [{m}, {n}]")
    return [((m, n), a.dtype)]


def gemm_batch_strides(mm: Node) -> tuple[int, int] | None:
    """The per-batch element strides of MatMul ``mm``'s A and B in the GEMM template (0: shared by
    every batch entry); None when the naive loop computes it (other dtypes, empty operands, batch dims
    that broadcast on both sides)."""
    a, b = mm.inputs[0], mm.inputs[1]
    assert a is not None and b is not None
    out = mm.outputs[0]
    if out.dtype != np.float32 or len(a.shape) < 2 or len(b.shape) < 2 or 0 in (*a.shape, *b.shape):
        return None
    m, kk = a.shape[-2:]
    n = b.shape[-1]
    nb = int(np.prod(out.shape[:-2]))
    strides = []
    for x, per in ((a, m * kk), (b, kk * n)):
        xb = int(np.prod(x.shape[:-2]))
        if xb == nb and tuple(x.shape[:-2]) == tuple(out.shape[len(out.shape) - len(x.shape):-2]) \
                and len(x.shape) == len(out.shape):
            strides.append(per if nb > 1 else 0)
        elif xb == 1:
            strides.append(0)
        else:
            return None
    return strides[0], strides[1]


def _matmul_takes_epilogue(mm: Node, out: Value, target: Target) -> bool:
    """Only the GEMM template has an epilogue (the naive loop has none), and it stores float32."""
    return out.dtype == np.float32 and out.shape == mm.outputs[0].shape and gemm_batch_strides(mm) is not None


register(OpDef("MatMul", "gemm", _matmul_infer, can_take_epilogue=_matmul_takes_epilogue))
# Only lives until the simplifier rewrites it (fold and inference still need it).
register(OpDef("Gemm", "gemm", _gemm_infer))


# -- Det: LU with partial pivoting per matrix, in double -------------------------------------------------
def _det_infer(node: Node):
    x = node.inputs[0]
    assert x is not None and x.shape is not None
    if len(x.shape) < 2 or x.shape[-1] != x.shape[-2]:
        raise AotcError(f"Det node {node.name!r}: needs square matrices, got {x.shape}")
    return [(tuple(x.shape[:-2]), x.dtype)]


def _det_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    x = node.inputs[0]
    assert x is not None
    m = x.shape[-1]
    nb = x.size // max(m * m, 1)
    # The matrix is factored in this task's scratch slot (a stack array of m * m doubles would
    # overflow a thread's stack for large m).
    return (f"double *restrict a = (double *)scratch + task * (size_t){max(m * m, 1)};\n"
            f"for (size_t b = task; b < {nb}; b += ntasks) {{\n"
            f"  double det = 1;\n"
            f"  for (size_t i = 0; i < {m * m}; i++) a[i] = {ins[0]}[b * {m * m} + i];\n"
            f"  for (size_t c = 0; c < {m}; c++) {{\n"
            f"    size_t p = c;\n"
            f"    for (size_t r = c + 1; r < {m}; r++) if (fabs(a[r * {m} + c]) > fabs(a[p * {m} + c])) p = r;\n"
            f"    if (a[p * {m} + c] == 0) {{ det = 0; break; }}\n"
            f"    if (p != c) {{ det = -det; for (size_t k = 0; k < {m}; k++) {{ double t = a[c * {m} + k]; "
            f"a[c * {m} + k] = a[p * {m} + k]; a[p * {m} + k] = t; }} }}\n"
            f"    det *= a[c * {m} + c];\n"
            f"    for (size_t r = c + 1; r < {m}; r++) {{\n"
            f"      const double f = a[r * {m} + c] / a[c * {m} + c];\n"
            f"      for (size_t k = c; k < {m}; k++) a[r * {m} + k] -= f * a[c * {m} + k];\n"
            f"    }}\n"
            f"  }}\n"
            f"  {outs[0]}[b] = ({ctype})det;\n}}")


def _det_scratch(node: Node) -> int:
    x = node.inputs[0]
    assert x is not None
    return 8 * max(x.shape[-1] ** 2, 1)


register(OpDef("Det", "kernel", _det_infer, emit=_det_emit, scratch=_det_scratch))
