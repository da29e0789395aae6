"""Gradients of Softmax, LogSoftmax and Dropout."""

from __future__ import annotations

from aotc.ir.graph import Node, Value
from aotc.ops.common import norm_axis
from aotc.ops.grads.builder import GradBuilder, Grads, rule
from aotc.ops.nn import dropout_mask


def _softmax_axes(node: Node) -> list[int]:
    """The axes a (Log)Softmax normalizes over: one from opset 13, the flattened tail before."""
    rank = len(node.outputs[0].shape)
    if rank == 0:
        return []
    if node.attr("_opset", 13) < 13:
        return list(range(norm_axis(node.attr("axis", 1), rank, node), rank))
    return [norm_axis(node.attr("axis", -1), rank, node)]


@rule("Softmax")
def _softmax(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    """dx = y (g - sum(g y))."""
    g, y = dys[0], node.outputs[0]
    assert g is not None
    return [b.mul(y, b.sub(g, b.reduce_sum(b.mul(g, y), _softmax_axes(node))))]


@rule("LogSoftmax")
def log_softmax_grad(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    """dx = g - exp(y) sum(g)."""
    g, y = dys[0], node.outputs[0]
    assert g is not None
    return [b.sub(g, b.mul(b.op("Exp", y), b.reduce_sum(g, _softmax_axes(node))))]


@rule("Dropout")
def _dropout(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    """Inference mode: the identity. Training mode: g times the kept-element factors, read from the
    node's mask output (added when the model has none), so that whatever writes the mask at run time
    (a generator replacing the compile-time draw) also decides the gradient."""
    g, x = dys[0], node.inputs[0]
    assert g is not None and x is not None
    drawn = dropout_mask(node)
    if drawn is None:
        return [g]
    if len(node.outputs) < 2:
        mask = Value(f"{node.outputs[0].name}_mask", x.shape, drawn[0].dtype, node)
        node.outputs.append(mask)
    mask = node.outputs[1]
    factor = float(drawn[1].max())  # 1 / (1 - ratio), in the input's type
    return [b.op("Where", mask, b.scale(g, factor), b.scalar(0, g))]
