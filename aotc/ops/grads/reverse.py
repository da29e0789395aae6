"""The reverse walk itself: which nodes lie between the values differentiated against and the loss,
and their rules applied from the loss back. ``aotc.training.autodiff.gradients`` runs it on a whole
graph; a rule that differentiates through a decomposition (``through``) runs it on a small one."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from aotc.errors import MissingOpsError
from aotc.ir.graph import Graph, Node, Value
from aotc.ops.grads.builder import GradBuilder, Grads, differentiable
from aotc.ops.registry import OPS


class NoGradientError(MissingOpsError):
    """Ops between the parameters and the loss without a gradient rule; lists every one at once."""

    what = "no gradient for"


def active_nodes(nodes: list[Node], loss: Value, wrt: list[Value]) -> list[Node]:
    """The nodes, in order, with a float output that depends on ``wrt`` and that the loss depends on;
    raises NoGradientError listing every one of them without a rule."""
    depends = {id(v) for v in wrt}
    for n in nodes:
        if any(v is not None and id(v) in depends for v in n.inputs):
            depends.update(id(v) for v in n.outputs if differentiable(v))
    needed = {id(loss)}
    active: list[Node] = []
    for n in reversed(nodes):
        if any(id(v) in needed and id(v) in depends for v in n.outputs):
            active.append(n)
            needed.update(id(v) for v in n.inputs if v is not None)
    missing: dict[str, list[str]] = {}
    for n in active:
        if OPS[n.op].grad is None:
            missing.setdefault(n.op, []).append(n.name or n.outputs[0].name)
    if missing:
        raise NoGradientError(missing)
    return active[::-1]


def reverse(b: GradBuilder, active: list[Node], loss: Value, wrt: list[Value]) -> dict[int, Value]:
    """Apply the rules of ``active`` from ``loss`` (seeded with ones) back; id(value) -> its cotangent."""
    depends = {id(v) for n in active for v in n.outputs} | {id(v) for v in wrt}
    cot: dict[int, Value] = {id(loss): b.const(np.ones(loss.shape, loss.dtype))}
    for n in reversed(active):
        dys = [cot.get(id(v)) for v in n.outputs]
        if all(g is None for g in dys):
            continue
        needs = [v is not None and id(v) in depends and differentiable(v) for v in n.inputs]
        b.node = n
        rule = OPS[n.op].grad
        assert rule is not None
        for v, g, need in zip(n.inputs, rule(b, n, dys, needs), needs, strict=False):
            if g is None or not need:
                continue
            assert v is not None and g.shape == v.shape and g.dtype == v.dtype, \
                f"{n.op} rule gave {g.type_str()} for {v.name!r} of {v.type_str()}"
            prev = cot.get(id(v))
            cot[id(v)] = g if prev is None else b.add(prev, g)
    b.node = None
    return cot


Decomposition = Callable[[GradBuilder, list[Value | None]], list[Value]]


def through(b: GradBuilder, node: Node, dys: Grads, needs: list[bool], build: Decomposition) -> Grads:
    """The cotangents of ``node``'s inputs by differentiating ``build``: the same function from ops
    that have rules (an RNN unrolled over time). The decomposition is built in a graph of its own on
    stand-ins for the inputs and cotangents, differentiated there, and spliced after ``b``'s nodes:
    the backward recomputes the forward's intermediates from the node's inputs."""
    sub = Graph(f"{node.name or node.op}_decomposed")
    sub.opset = b.graph.opset
    sb = GradBuilder(sub, f"{b.prefix}/{node.name or node.op}")
    ins = [None if v is None else v if v.is_const else Value(f"{sb.prefix}/in{i}", v.shape, v.dtype)
           for i, v in enumerate(node.inputs)]
    cots = [None if g is None else Value(f"{sb.prefix}/cot{k}", g.shape, g.dtype) for k, g in enumerate(dys)]
    outs = build(sb, ins)
    terms = [sb.reduce_sum(sb.mul(o, c), list(range(len(o.shape))), keepdims=False)
             for o, c in zip(outs, cots, strict=False) if c is not None]
    loss = terms[0]
    for t in terms[1:]:
        loss = sb.add(loss, t)
    wrt = [v for v, need in zip(ins, needs, strict=False) if need and v is not None and not v.is_const]
    cot = reverse(sb, active_nodes(sub.nodes, loss, wrt), loss, wrt)
    outer = {id(s): v for s, v in zip(ins, node.inputs, strict=True) if s is not None and s is not v}
    outer.update({id(s): g for s, g in zip(cots, dys, strict=True) if s is not None})
    for n in sub.nodes:
        n.inputs = [None if v is None else outer.get(id(v), v) for v in n.inputs]
        b.graph.nodes.append(n)
    return [cot.get(id(s)) if s is not None and need else None for s, need in zip(ins, needs, strict=False)]
