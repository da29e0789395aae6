"""Reverse-mode automatic differentiation over the IR.

``gradients`` walks the nodes between the values differentiated against and the loss backwards
(aotc/ops/grads/reverse.py), asking each op's gradient rule (``OpDef.grad``, in aotc/ops/grads/) for
its inputs' cotangents, and appends what the rules build, ordinary nodes, to the same graph: the
backward pass then goes through the same passes as the forward one (fusion, memory planning) and reads
the forward activations it needs.
"""

from __future__ import annotations

import numpy as np

import aotc.ops.grads  # noqa: F401  (attaches the rules to the op table)
from aotc.errors import AotcError
from aotc.ir.graph import Graph, Value
from aotc.ops.grads.builder import GradBuilder, differentiable
from aotc.ops.grads.conv import conv_as_gemm
from aotc.ops.grads.reverse import NoGradientError, active_nodes, reverse
from aotc.passes.propagate import propagate

__all__ = ["NoGradientError", "gradients", "lower_runtime_convs"]


def gradients(graph: Graph, loss: Value, wrt: list[Value], prefix: str = "grad") -> dict[str, Value]:
    """Append the backward pass of ``loss`` (a float scalar) to ``graph``; return, per value of ``wrt``
    (by name), the value holding d loss / d value, of that value's shape and dtype.

    ``wrt`` holds values computed at run time (graph inputs, typically the parameters once they are
    inputs): a constant would be folded away with everything computed from it alone. A value the loss
    does not depend on gets zeros. New node and value names start with ``prefix``."""
    if any(n.outputs and n.outputs[0].shape is None for n in graph.nodes):
        propagate(graph)  # shapes and dtypes, which the rules read
    for v in wrt:
        if v.is_const:
            raise AotcError(f"cannot differentiate with respect to {v.name!r}: it is a constant; make it an input")
        if not differentiable(v):
            raise AotcError(f"cannot differentiate with respect to {v.name!r}: its type {v.type_str()} is not float")
    if loss.shape is None or loss.size != 1 or not differentiable(loss):
        raise AotcError(f"the loss {loss.name!r} must be a float scalar, not {loss.type_str()}")

    lower_runtime_convs(graph, f"{prefix}_conv")
    active = active_nodes(graph.nodes, loss, wrt)
    b = GradBuilder(graph, prefix)
    cot = reverse(b, active, loss, wrt)
    return {v.name: cot[id(v)] if id(v) in cot else b.zeros(v.shape, v.dtype) for v in wrt}


def lower_runtime_convs(graph: Graph, prefix: str = "gemm") -> int:
    """Rewrite each float32 Conv whose weights are computed at run time (the parameters of a training
    step) and that is not depthwise as im2col + GEMM: the conv kernels' fast paths need constant
    weights, the GEMM kernel does not. Returns how many were rewritten."""
    b = GradBuilder(graph, prefix)
    todo = [n for n in graph.nodes if n.op == "Conv" and n.inputs[1] is not None and not n.inputs[1].is_const
            and n.outputs[0].dtype == np.float32 and n.inputs[1].shape[1] > 1]
    for n in todo:
        b.node = n
        conv_as_gemm(b, n)
        graph.nodes.remove(n)
    if todo:
        graph.toposort()
    return len(todo)
