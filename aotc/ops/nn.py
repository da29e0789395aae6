"""Neural-network ops that are template kernels of their own: softmax family, dropout."""

from __future__ import annotations

import numpy as np

from aotc.ir.graph import Node
from aotc.ops.common import norm_axis
from aotc.ops.registry import OpDef, register


def softmax_layout(node: Node) -> tuple[int, int, int]:
    """(outer, n, inner): softmax runs over n elements spaced ``inner`` apart.

    Before opset 13 the input is coerced to 2-D at ``axis`` (default 1) and the softmax runs over the
    whole flattened tail; from 13 on it runs over the one axis (default -1).
    """
    shape = node.outputs[0].shape
    rank = len(shape)
    if rank == 0:
        return 1, 1, 1
    if node.attr("_opset", 13) < 13:
        axis = norm_axis(node.attr("axis", 1), rank, node)
        return int(np.prod(shape[:axis])), int(np.prod(shape[axis:])), 1
    axis = norm_axis(node.attr("axis", -1), rank, node)
    return int(np.prod(shape[:axis])), shape[axis], int(np.prod(shape[axis + 1:]))


def _same(node: Node):
    x = node.inputs[0]
    assert x is not None
    return [(x.shape, x.dtype)]


def _softmax_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    outer, n, inner = softmax_layout(node)
    head = (f"for (size_t r = task; r < {outer * inner}; r += ntasks) {{\n"
            f"  size_t o = r / {inner}, k = r % {inner};\n")
    x, y = f"{ins[0]} + o * {n * inner} + k", f"{outs[0]} + o * {n * inner} + k"
    if ctype == "float":  # the vectorized row kernels of runtime/aotc_rows.h
        fn = "aotc_log_softmax_row" if node.op == "LogSoftmax" else "aotc_softmax_row"
        return head + f"  {fn}({x}, {y}, {n}, {inner});\n}}"
    # double: the same three passes (max, sum of exp, normalize) with libm, NaN propagating.
    lines = [f"  const {ctype} *restrict xr = {x};",
             f"  {ctype} *restrict yr = {y};",
             f"  {ctype} m = -INFINITY, s = 0;",
             f"  for (size_t i = 0; i < {n}; i++) {{ const {ctype} v = xr[i * {inner}]; "
             f"m = (v > m || v != v) ? v : m; }}"]
    if node.op == "LogSoftmax":
        lines += [f"  for (size_t i = 0; i < {n}; i++) s += exp(xr[i * {inner}] - m);",
                  f"  const {ctype} lse = m + log(s);",
                  f"  for (size_t i = 0; i < {n}; i++) yr[i * {inner}] = xr[i * {inner}] - lse;"]
    else:
        lines += [f"  for (size_t i = 0; i < {n}; i++) {{ yr[i * {inner}] = exp(xr[i * {inner}] - m); "
                  f"s += yr[i * {inner}]; }}",
                  f"  for (size_t i = 0; i < {n}; i++) yr[i * {inner}] /= s;"]
    return head + "\n".join(lines) + "\n}"


register(OpDef("Softmax", "kernel", _same, emit=_softmax_emit))
register(OpDef("LogSoftmax", "kernel", _same, emit=_softmax_emit))
# Inference-mode dropout is the identity; the simplifier removes it.
register(OpDef("Dropout", "alias", lambda n: [(n.inputs[0].shape, n.inputs[0].dtype),
                                               (n.inputs[0].shape, np.dtype(np.bool_))]))


def _bn_infer(node: Node):
    x = node.inputs[0]
    assert x is not None
    return [(x.shape, x.dtype)]


# Inference-mode batch norm; the simplifier rewrites it into a per-channel scale and shift, which
# then folds into a preceding MatMul/Conv or fuses into the surrounding loop.
register(OpDef("BatchNormalization", "elementwise_rewrite", _bn_infer))
