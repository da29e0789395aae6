"""Gradient of Resize/Upsample. Resizing is separable: along each resized axis the output is a
constant matrix A [out, in] (the taps and weights the forward kernel tabulates: nearest, linear or cubic,
any coordinate transformation) times the input. The cotangent goes back through A^T axis by axis, each
a MatMul with a small constant, so the GEMM kernel does the scatter."""

from __future__ import annotations

import numpy as np

from aotc.ir.graph import Node
from aotc.ops.grads.builder import GradBuilder, Grads, rule
from aotc.ops.index import resize_axis_weights, resize_params


def axis_matrix(node: Node, axis: int) -> np.ndarray | None:
    """A for one axis ([out, in], float64), or None where the axis is copied unchanged."""
    x = node.inputs[0]
    assert x is not None
    out, scales, roi = resize_params(node)
    rank = len(out)
    n_in, n_out = x.shape[axis], out[axis]
    if n_in == n_out and abs(scales[axis] - 1) < 1e-12 and (roi is None or (roi[axis] == 0 and roi[rank + axis] == 1)):
        return None
    idx, w = resize_axis_weights(node, n_in, n_out, scales[axis],
                                 None if roi is None else (roi[axis], roi[rank + axis]))
    a = np.zeros((n_out, n_in))
    rows = np.repeat(np.arange(n_out), idx.shape[1])
    inside = idx.reshape(-1) >= 0  # extrapolated outputs read no input
    np.add.at(a, (rows[inside], idx.reshape(-1)[inside]), w.reshape(-1)[inside])
    return a


@rule("Resize", "Upsample")
def _resize(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, g = node.inputs[0], dys[0]
    assert x is not None and g is not None
    rank = len(x.shape)
    for axis in range(rank):
        a = axis_matrix(node, axis)
        if a is None:
            continue
        perm = [*(d for d in range(rank) if d != axis), axis]  # the axis last, contracted with A
        back = [int(p) for p in np.argsort(perm)]
        g = b.transpose(b.op("MatMul", b.transpose(g, perm), b.const(a, x.dtype)), back)
    return [g, *[None] * (len(node.inputs) - 1)]
