"""Gradients of SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss: one internal kernel each
(``aotc.SoftmaxCrossEntropyLossGrad``, ``aotc.NegativeLogLikelihoodLossGrad``) that reads the loss's
cotangent, the scores and the targets and writes the scores' cotangent, with the forward kernel's
conventions (ignore_index, class weights, and the mean dividing by the summed weights)."""

from __future__ import annotations

from aotc.ir.graph import Node
from aotc.ops.grads.builder import GradBuilder, Grads, rule
from aotc.ops.grads.nn import log_softmax_grad
from aotc.ops.nn import loss_params, loss_target, max_shifted_exp_sum
from aotc.ops.registry import OpDef, register


def _grad_infer(node: Node):
    x = node.inputs[1]
    assert x is not None
    return [(x.shape, x.dtype)]


def _grad_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    """Inputs: the loss's cotangent, scores x (N, C, d...), targets (N, d...), optional weights (C).
    Rows (i, k) are split between the tasks; each task sums the weights itself for the mean."""
    p = loss_params(node, 1)
    n, c, d = p.n, p.c, p.d
    g, xs, ts = ins[0], ins[1], ins[2]
    weights = ins[p.weights] if p.weights else None
    lines = []
    if p.reduction == "mean":
        lines += ["double sw = 0;", f"for (size_t r = 0; r < {n * d}; r++) {{",
                  *loss_target(p, "u", f"{ts}[r]", weights), "  sw += u_w;", "}"]
    lines += [f"for (size_t r = task; r < {n * d}; r += ntasks) {{",
              f"  const size_t i = r / {d}, k = r % {d};",
              *([f"  const {ctype} *xr = {xs} + i * {c * d} + k;"] if p.softmax else []),
              f"  {ctype} *dr = {outs[0]} + i * {c * d} + k;",
              *loss_target(p, "t", f"{ts}[r]", weights)]
    coef = {"mean": f"(double){g}[0] * t_w / sw",
            "sum": f"(double){g}[0] * t_w"}.get(p.reduction, f"(double){g}[r] * t_w")
    lines.append(f"  const double coef = {coef};")
    if p.softmax:
        lines += [*max_shifted_exp_sum(p),
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
