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
    fn = "aotc_log_softmax_row" if node.op == "LogSoftmax" else "aotc_softmax_row"
    return (f"for (size_t r = task; r < {outer * inner}; r += ntasks) {{\n"
            f"  size_t o = r / {inner}, k = r % {inner};\n"
            f"  {fn}({ins[0]} + o * {n * inner} + k, {outs[0]} + o * {n * inner} + k, {n}, {inner});\n"
            f"}}")


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
