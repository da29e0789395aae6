"""The optimizer steps of ``ai.onnx.preview.training``: Adagrad, Momentum and Adam.

Each node updates n tensors at once: inputs are the learning rate R, the step count T, then n
tensors X, n gradients G and the optimizer's n (Adagrad, Momentum) or 2n (Adam) state tensors;
outputs are the new X and the new state, grouped the same way. An application that trains on
device calls the compiled step like any other model. Arithmetic is in double, rounded once.
"""

from __future__ import annotations

from aotc.errors import AotcError
from aotc.ir.graph import Node
from aotc.ops.registry import OpDef, register

_STATE = {"Adagrad": 1, "Momentum": 1, "Adam": 2}  # state tensors per updated tensor
_DOMAIN = "ai.onnx.preview.training."


def _groups(node: Node) -> int:
    per = 2 + _STATE[node.op.removeprefix(_DOMAIN)]  # X, G and the states
    n, rest = divmod(len(node.inputs) - 2, per)
    if rest or n < 1:
        raise AotcError(f"{node.op} node {node.name!r}: expected 2 + {per} * n inputs, got {len(node.inputs)}")
    return n


def _infer(node: Node):
    n = _groups(node)
    tensors = node.inputs[2:]
    x_and_states = tensors[:n] + tensors[2 * n:]
    return [(v.shape, v.dtype) for v in x_and_states if v is not None]


def _f(node: Node, key: str, default: float) -> str:
    return repr(float(node.attr(key, default)))


def _step(node: Node, ctype: str) -> tuple[list[str], list[str]]:
    """(per-step scalar setup lines, per-element lines) over doubles x, g, s0[, s1] -> x_new, s0_new[, s1_new]."""
    op = node.op.removeprefix(_DOMAIN)
    lam = _f(node, "norm_coefficient", 0.0)
    pre = ["const double r = (double)R[0];", "const int64_t t = T[0];"]
    body = [f"const double gr = {lam} * x + g;"]
    if op == "Adagrad":
        pre.append(f"const double rt = r / (1 + (double)t * {_f(node, 'decay_factor', 0.0)});")
        body += ["const double h = s0 + gr * gr;",
                 f"x_new = x - rt * gr / (sqrt(h) + {_f(node, 'epsilon', 0.0)});", "s0_new = h;"]
    elif op == "Momentum":
        mode = node.attr("mode", "standard")
        if mode not in ("standard", "nesterov"):
            raise AotcError(f"{node.op} node {node.name!r}: unknown mode {mode!r}")
        alpha = _f(node, "alpha", 0.0)
        pre.append(f"const double beta = t > 0 ? {_f(node, 'beta', 0.0)} : 1.0;")
        body.append(f"const double v = {alpha} * s0 + beta * gr;")
        body.append("x_new = x - r * v;" if mode == "standard" else f"x_new = x - r * (gr + {alpha} * v);")
        body.append("s0_new = v;")
    else:  # Adam
        alpha, beta = _f(node, "alpha", 0.9), _f(node, "beta", 0.999)
        pre.append(f"const double ra = t > 0 ? r * sqrt(1 - pow({beta}, (double)t)) / "
                   f"(1 - pow({alpha}, (double)t)) : r;")
        body += [f"const double v = {alpha} * s0 + (1 - {alpha}) * gr;",
                 f"const double h = {beta} * s1 + (1 - {beta}) * gr * gr;",
                 f"x_new = (1 - {_f(node, 'norm_coefficient_post', 0.0)}) * "
                 f"(x - ra * (v / (sqrt(h) + {_f(node, 'epsilon', 0.0)})));",
                 "s0_new = v;", "s1_new = h;"]
    return pre, body


def _emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    n = _groups(node)
    states = _STATE[node.op.removeprefix(_DOMAIN)]
    pre, body = _step(node, ctype)
    lines = [f"const {ctype} *R = {ins[0]};", f"const int64_t *T = {ins[1]};", *pre,
             "if (task != 0) return;  /* one task: the tensors are small */", "(void)ntasks;"]
    for i in range(n):
        v = node.inputs[2 + i]
        assert v is not None
        x, g = ins[2 + i], ins[2 + n + i]
        s_in = [ins[2 + (2 + s) * n + i] for s in range(states)]
        s_out = [outs[(1 + s) * n + i] for s in range(states)]
        decl_new = ", ".join(["x_new", *(f"s{s}_new" for s in range(states))])
        lines += [f"for (size_t e = 0; e < {v.size}; e++) {{",
                  f"  const double x = {x}[e], g = {g}[e];",
                  *(f"  const double s{s} = {s_in[s]}[e];" for s in range(states)),
                  f"  double {decl_new};",
                  *(f"  {line}" for line in body),
                  f"  {outs[i]}[e] = ({ctype})x_new;",
                  *(f"  {s_out[s]}[e] = ({ctype})s{s}_new;" for s in range(states)),
                  "}"]
    return "\n".join(lines)


for _op in _STATE:
    register(OpDef(_DOMAIN + _op, "kernel", _infer, emit=_emit))
