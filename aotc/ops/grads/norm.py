"""Gradients of BatchNormalization and LayerNormalization.

Training-mode BatchNorm (batch statistics) has its own kernel, ``aotc.BatchNormalizationGrad``: one
task per channel recomputes the channel's mean and variance in double, as the forward kernel does, and
writes dX, dScale and dBias. Inference-mode BatchNorm and LayerNorm are built from ordinary nodes;
LayerNorm reads the mean and inverse deviation its forward kernel writes (outputs added when absent).
"""

from __future__ import annotations

import numpy as np

from aotc.ir import dtypes
from aotc.ir.graph import Node, Value
from aotc.ops.common import norm_axis
from aotc.ops.grads.builder import GradBuilder, Grads, rule
from aotc.ops.grads.reverse import through
from aotc.ops.nn import bn_training, channel_sums
from aotc.ops.norm import ln_axis
from aotc.ops.registry import OpDef, register


def _bn_grad_infer(node: Node):
    x, s = node.inputs[0], node.inputs[1]
    assert x is not None and s is not None
    return [(x.shape, x.dtype), (s.shape, s.dtype), (s.shape, s.dtype)]


def _bn_grad_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    """With xh = (x - m) / sqrt(v + eps) over the channel's N * HW elements:
    dBias = sum g, dScale = sum g xh, dX = scale / sqrt(v + eps) (g - dBias / NHW - xh dScale / NHW)."""
    x = node.inputs[0]
    assert x is not None
    n, c = x.shape[0], x.shape[1]
    inner = int(np.prod(x.shape[2:]))
    cnt = n * inner
    eps = float(node.attr("epsilon", 1e-5))
    st = dtypes.c_type(node.inputs[1].dtype)
    return "\n".join([
        f"const {ctype} *x = {ins[0]}, *g = {ins[2]};",
        f"for (size_t ch = task; ch < {c}; ch += ntasks) {{",
        "  double s = 0, ss = 0, sg = 0, sgx = 0;",
        *channel_sums(n, c, inner, ctype, {"xr": "x"}, {"s": "xr[j]"}),
        f"  const {ctype} m = ({ctype})(s / {cnt});",
        *channel_sums(n, c, inner, ctype, {"xr": "x"}, {"ss": "(xr[j] - m) * (xr[j] - m)"}),
        f"  const double inv = 1 / sqrt(ss / {cnt} + {eps!r});",
        *channel_sums(n, c, inner, ctype, {"xr": "x", "gr": "g"}, {"sg": "gr[j]", "sgx": "gr[j] * (xr[j] - m)"}),
        "  sgx *= inv;",
        f"  const {ctype} k1 = ({ctype})({ins[1]}[ch] * inv), mg = ({ctype})(sg / {cnt}), "
        f"kx = ({ctype})(inv * sgx / {cnt});",
        f"  for (size_t b = 0; b < {n}; b++) {{",
        f"    const size_t at = (b * {c} + ch) * {inner};",
        f"    for (size_t k = 0; k < {inner}; k++) "
        f"{outs[0]}[at + k] = k1 * (g[at + k] - mg - (x[at + k] - m) * kx);",
        "  }",
        f"  {outs[1]}[ch] = ({st})sgx;",
        f"  {outs[2]}[ch] = ({st})sg;",
        "}"])


register(OpDef("aotc.BatchNormalizationGrad", "kernel", _bn_grad_infer, emit=_bn_grad_emit))


@rule("BatchNormalization")
def _batchnorm(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    """Only Y carries a cotangent: the running statistics (outputs 1 and 2) are state, not results."""
    x, scale, g = node.inputs[0], node.inputs[1], dys[0]
    assert x is not None and scale is not None
    if g is None:
        return []
    if bn_training(node):
        dx, ds, db = b.ops("aotc.BatchNormalizationGrad", [x, scale, g], 3, epsilon=node.attr("epsilon", 1e-5))
        return [dx, ds, db, None, None]
    # Inference mode: y = (x - mean) inv scale + bias with inv = 1 / sqrt(var + eps), per channel.
    mean, var = node.inputs[3], node.inputs[4]
    assert mean is not None and var is not None
    per_channel = (x.shape[1], *[1] * (len(x.shape) - 2))
    inv = b.reshape(b.op("Reciprocal", b.op("Sqrt", b.add(var, b.scalar(float(node.attr("epsilon", 1e-5)), var)))),
                    per_channel)
    axes = [0, *range(2, len(x.shape))]
    xhat = b.mul(b.sub(x, b.reshape(mean, per_channel)), inv) if needs[1] else None
    dx = b.mul(g, b.mul(b.reshape(scale, per_channel), inv)) if needs[0] else None
    ds = b.reshape(b.reduce_sum(b.mul(g, xhat), axes), scale.shape) if needs[1] and xhat is not None else None
    db = b.reshape(b.reduce_sum(g, axes), scale.shape) if needs[2] else None
    return [dx, ds, db, None, None]


@rule("LayerNormalization")
def _layernorm(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    """dx = inv (gs - mean(gs) - xh mean(gs xh)) with gs = g scale and xh = (x - mean) inv over the row."""
    x, scale, g = node.inputs[0], node.inputs[1], dys[0]
    assert x is not None and scale is not None
    if g is None:
        return []
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    axis = ln_axis(node)
    rank = len(x.shape)
    row_axes = list(range(axis, rank))
    n = int(np.prod(x.shape[axis:]))
    stat_shape = (*x.shape[:axis], *[1] * (rank - axis))
    stat_dtype = np.dtype(np.float32) if node.attr("stash_type", 1) == 1 else np.dtype(x.dtype)
    while len(node.outputs) < 3:  # the kernel writes them on its way
        node.outputs.append(Value("", stat_shape, stat_dtype, node))
    for k, what in ((1, "mean"), (2, "invstd")):
        if not node.outputs[k].name:  # absent, or omitted in the model (the kernel skips unnamed outputs)
            node.outputs[k].name = f"{node.outputs[0].name}_{what}"
    mean, inv = node.outputs[1], node.outputs[2]
    if mean.dtype != x.dtype:
        mean, inv = (b.op("Cast", v, to=dtypes.onnx_type(x.dtype)) for v in (mean, inv))
    xhat = b.mul(b.sub(x, mean), inv)
    gs = b.mul(g, scale)
    mg = b.scale(b.reduce_sum(gs, row_axes), 1 / n)
    mgx = b.scale(b.reduce_sum(b.mul(gs, xhat), row_axes), 1 / n)
    dx = b.mul(inv, b.sub(b.sub(gs, mg), b.mul(xhat, mgx))) if needs[0] else None
    ds = b.sum_to(b.mul(g, xhat), scale.shape) if needs[1] else None
    db = b.sum_to(g, bias.shape) if bias is not None and len(needs) > 2 and needs[2] else None
    return [dx, ds, db]


@rule("InstanceNormalization", "GroupNormalization")
def _group_norm(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    """As LayerNorm's, over the (group, channel-in-group, position) view [N, G, C/G, S] of x, with the
    statistics recomputed per (n, group) and the scale and bias per channel (or per group, opset 18)."""
    x, scale, g = node.inputs[0], node.inputs[1], dys[0]
    assert x is not None and scale is not None and g is not None
    bias = node.inputs[2]
    n, c, s = x.shape[0], x.shape[1], int(np.prod(x.shape[2:]))
    groups = c if node.op == "InstanceNormalization" else int(node.attr("num_groups"))
    per = c // groups
    per_group = node.op == "GroupNormalization" and node.attr("_opset", 21) < 21 and scale.shape[0] == groups
    view = (n, groups, per, s)
    param = (1, groups, 1, 1) if per_group else (1, groups, per, 1)
    param_axes = [0, 2, 3] if per_group else [0, 3]
    count = per * s
    x4, g4 = b.reshape(x, view), b.reshape(g, view)
    xc = b.sub(x4, b.scale(b.reduce_sum(x4, [2, 3]), 1 / count))
    inv = b.op("Reciprocal", b.op("Sqrt", b.add(b.scale(b.reduce_sum(b.mul(xc, xc), [2, 3]), 1 / count),
                                                 b.scalar(float(node.attr("epsilon", 1e-5)), x))))
    xhat = b.mul(xc, inv)
    gs = b.mul(g4, b.reshape(scale, param))
    mg = b.scale(b.reduce_sum(gs, [2, 3]), 1 / count)
    mgx = b.scale(b.reduce_sum(b.mul(gs, xhat), [2, 3]), 1 / count)
    dx = b.reshape(b.mul(inv, b.sub(b.sub(gs, mg), b.mul(xhat, mgx))), x.shape) if needs[0] else None
    ds = b.reshape(b.reduce_sum(b.mul(g4, xhat), param_axes), scale.shape) if needs[1] else None
    db = b.reshape(b.reduce_sum(g4, param_axes), bias.shape) if bias is not None and needs[2] else None
    return [dx, ds, db]


@rule("RMSNormalization")
def _rms_norm(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    """y = x r scale with r = 1 / sqrt(mean(x^2) + eps) over the row: dx = r (gs - x r^2 mean(gs x)) with
    gs = g scale, the statistic recomputed; dScale = g x r summed to the scale's shape."""
    x, scale, g = node.inputs[0], node.inputs[1], dys[0]
    assert x is not None and scale is not None and g is not None
    axis = norm_axis(node.attr("axis", -1), len(x.shape), node)
    row = list(range(axis, len(x.shape)))
    n = int(np.prod(x.shape[axis:]))
    r = b.op("Reciprocal", b.op("Sqrt", b.add(b.scale(b.reduce_sum(b.mul(x, x), row), 1 / n),
                                               b.scalar(float(node.attr("epsilon", 1e-5)), x))))
    gs = b.mul(g, scale)
    dx = None
    if needs[0]:
        mgx = b.scale(b.reduce_sum(b.mul(gs, x), row), 1 / n)
        dx = b.mul(r, b.sub(gs, b.mul(b.mul(x, b.mul(r, r)), mgx)))
    ds = b.sum_to(b.mul(g, b.mul(x, r)), scale.shape) if needs[1] else None
    return [dx, ds]


def _lp_norm(node: Node):
    def build(b: GradBuilder, ins: list[Value | None]) -> list[Value]:
        x = ins[0]
        assert x is not None
        axis = norm_axis(node.attr("axis", -1), len(x.shape), node)
        op = "ReduceL1" if int(node.attr("p", 2)) == 1 else "ReduceL2"
        return [b.div(x, b.op(op, x, b.ints([axis]), keepdims=1))]
    return build


def _mean_variance(node: Node):
    """(x - mean) / (std + 1e-9) over ``axes``, as the forward kernel computes it."""
    def build(b: GradBuilder, ins: list[Value | None]) -> list[Value]:
        x = ins[0]
        assert x is not None
        axes = sorted(norm_axis(int(a), len(x.shape), node) for a in node.attr("axes", [0, 2, 3]))
        count = int(np.prod([x.shape[a] for a in axes]))
        xc = b.sub(x, b.scale(b.reduce_sum(x, axes), 1 / count))
        std = b.op("Sqrt", b.scale(b.reduce_sum(b.mul(xc, xc), axes), 1 / count))
        return [b.div(xc, b.add(std, b.scalar(1e-9, x)))]
    return build


def _lrn(node: Node):
    """x / (bias + alpha / size * s)^beta with s the sum of squares over a window of channels."""
    def build(b: GradBuilder, ins: list[Value | None]) -> list[Value]:
        x = ins[0]
        assert x is not None
        size, c = int(node.attr("size")), x.shape[1]
        alpha, beta, bias = (float(node.attr(k, d)) for k, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
        lo, hi = (size - 1) // 2, size // 2
        pads = [0] * (2 * len(x.shape))
        pads[1], pads[len(x.shape) + 1] = lo, hi
        sq = b.op("Pad", b.mul(x, x), b.ints(pads), b.scalar(0, x))
        s = b.op("Slice", sq, b.ints([0]), b.ints([c]), b.ints([1]))
        for k in range(1, size):
            s = b.add(s, b.op("Slice", sq, b.ints([k]), b.ints([k + c]), b.ints([1])))
        den = b.op("Pow", b.add(b.scalar(bias, x), b.scale(s, alpha / size)), b.scalar(beta, x))
        return [b.div(x, den)]
    return build


_DECOMPOSED = {"LpNormalization": _lp_norm, "MeanVarianceNormalization": _mean_variance, "LRN": _lrn}


@rule(*_DECOMPOSED)
def _decomposed(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    return through(b, node, dys, needs, _DECOMPOSED[node.op](node))
