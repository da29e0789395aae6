"""Gradients of the reductions: the cotangent broadcast back over the reduced axes, times the
derivative of what was reduced."""

from __future__ import annotations

import numpy as np

from aotc.ir import dtypes
from aotc.ir.graph import Node, Value
from aotc.ops.grads.builder import GradBuilder, Grads, rule
from aotc.ops.reduce import reduce_axes


def _kept(node: Node) -> tuple[int, ...]:
    """The reduction's output shape with the reduced axes kept (as ones)."""
    x = node.inputs[0]
    assert x is not None
    axes = reduce_axes(node)
    return tuple(1 if i in axes else d for i, d in enumerate(x.shape))


def _spread(b: GradBuilder, node: Node, v: Value) -> Value:
    """``v`` (of the output's shape) broadcast back to the input's."""
    x = node.inputs[0]
    assert x is not None
    return b.expand(b.reshape(v, _kept(node)), x.shape)


@rule("ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
      "ReduceMax", "ReduceMin")
def _reduce(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, g, y = node.inputs[0], dys[0], node.outputs[0]
    assert x is not None and g is not None
    op = node.op
    if op == "ReduceMean":
        n = int(np.prod([x.shape[a] for a in reduce_axes(node)]))
        gx = _spread(b, node, b.scale(g, 1 / max(n, 1)))
    elif op == "ReduceSum":
        gx = _spread(b, node, g)
    elif op == "ReduceSumSquare":
        gx = b.mul(_spread(b, node, g), b.scale(x, 2))
    elif op == "ReduceL1":
        gx = b.mul(_spread(b, node, g), b.op("Sign", x))
    elif op == "ReduceLogSum":
        gx = _spread(b, node, b.div(g, b.op("Exp", y)))
    elif op == "ReduceL2":
        gx = b.mul(_spread(b, node, b.div(g, y)), x)
    elif op == "ReduceLogSumExp":
        gx = b.mul(_spread(b, node, g), b.op("Exp", b.sub(x, b.reshape(y, _kept(node)))))
    else:  # Max/Min: shared equally by the elements that reach the extreme (as torch.amax)
        hit = b.op("Cast", b.op("Equal", x, b.reshape(y, _kept(node))), to=dtypes.onnx_type(x.dtype))
        count = b.reduce_sum(hit, reduce_axes(node))
        gx = b.mul(hit, b.expand(b.div(b.reshape(g, _kept(node)), count), x.shape))
    return [gx, *[None] * (len(node.inputs) - 1)]
