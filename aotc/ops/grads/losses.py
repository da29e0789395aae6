"""Gradients of SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss: one internal kernel each
(``aotc.SoftmaxCrossEntropyLossGrad``, ``aotc.NegativeLogLikelihoodLossGrad``) that reads the loss's
cotangent, the scores and the targets and writes the scores' cotangent, with the forward kernel's
conventions (ignore_index, class weights, and the mean dividing by the summed weights)."""

from __future__ import annotations

import numpy as np

from aotc.ir.graph import Node
from aotc.ops.grads.builder import GradBuilder, Grads, rule
from aotc.ops.grads.nn import log_softmax_grad
from aotc.ops.registry import OpDef, register


def _grad_infer(node: Node):
    x = node.inputs[1]
    assert x is not None
    return [(x.shape, x.dtype)]


def _grad_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    """Inputs: the loss's cotangent, scores x (N, C, d...), targets (N, d...), optional weights (C).
    Rows (i, k) are split between the tasks; each task sums the weights itself for the mean."""
    x = node.inputs[1]
    assert x is not None
    n, c = x.shape[0], x.shape[1]
    d = int(np.prod(x.shape[2:]))
    has_w = len(node.inputs) > 3 and node.inputs[3] is not None
    ign = node.attr("ignore_index")
    red = node.attr("reduction", "mean")
    sce = node.op == "aotc.SoftmaxCrossEntropyLossGrad"
    g, xs, ts = ins[0], ins[1], ins[2]

    def target(var: str, at: str) -> list[str]:
        return [f"  int64_t {var} = (int64_t){ts}[{at}];",
                f"  const int {var}_ignored = {f'{var} == INT64_C({int(ign)})' if ign is not None else '0'};",
                f"  {var} = {var} < 0 ? 0 : ({var} >= {c} ? {c - 1} : {var});",
                f"  const double {var}_w = {var}_ignored ? 0 : {f'(double){ins[3]}[{var}]' if has_w else '1'};"]

    lines = []
    if red == "mean":
        lines += ["double sw = 0;", f"for (size_t r = 0; r < {n * d}; r++) {{", *target("u", "r"),
                  "  sw += u_w;", "}"]
    lines += [f"for (size_t r = task; r < {n * d}; r += ntasks) {{",
              f"  const size_t i = r / {d}, k = r % {d};",
              *([f"  const {ctype} *xr = {xs} + i * {c * d} + k;"] if sce else []),
              f"  {ctype} *dr = {outs[0]} + i * {c * d} + k;",
              *target("t", "r")]
    coef = {"mean": f"(double){g}[0] * t_w / sw", "sum": f"(double){g}[0] * t_w"}.get(red, f"(double){g}[r] * t_w")
    lines.append(f"  const double coef = {coef};")
    if sce:
        lines += ["  double m = -INFINITY, s = 0;",
                  f"  for (size_t j = 0; j < {c}; j++) m = xr[j * {d}] > m ? xr[j * {d}] : m;",
                  f"  for (size_t j = 0; j < {c}; j++) s += exp((double)xr[j * {d}] - m);",
                  f"  for (size_t j = 0; j < {c}; j++) dr[j * {d}] = ({ctype})(coef * (exp((double)xr[j * {d}] - m) / s"
                  " - (j == (size_t)t)));"]
    else:
        lines += [f"  for (size_t j = 0; j < {c}; j++) dr[j * {d}] = 0;",
                  f"  dr[t * {d}] = ({ctype})(-coef);"]
    return "\n".join([*lines, "}"])


register(OpDef("aotc.SoftmaxCrossEntropyLossGrad", "kernel", _grad_infer, emit=_grad_emit))
register(OpDef("aotc.NegativeLogLikelihoodLossGrad", "kernel", _grad_infer, emit=_grad_emit))


@rule("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss")
def _loss(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, t = node.inputs[0], node.inputs[1]
    assert x is not None and t is not None
    w = node.inputs[2] if len(node.inputs) > 2 else None
    gx = None
    attrs = {k: node.attrs[k] for k in ("reduction", "ignore_index") if k in node.attrs}
    if dys[0] is not None:
        gx = b.op(f"aotc.{node.op}Grad", dys[0], x, t, *([w] if w is not None else []), **attrs)
    if len(dys) > 1 and dys[1] is not None:  # the log-probabilities: a LogSoftmax over the classes
        lp = node.outputs[1]
        probe = Node("LogSoftmax", [x], [lp], {"axis": 1, "_opset": 13}, node.name)
        glp = log_softmax_grad(b, probe, [dys[1]], [True])[0]
        assert glp is not None
        gx = glp if gx is None else b.add(gx, glp)
    return [gx, None, None]
