"""Gradients of Conv as matrix products, so that they run on the GEMM kernel whatever the weights are.

With the input unfolded into columns, cols[g, (n, o), (c, k)] = x[n, g * Cg + c, o * s + k * d - p]
(``aotc.Im2Col``; zeros in the padding), the weights as W[g, m, (c, k)] and the cotangent as
G[g, m, (n, o)], per group g:

    dW = G @ cols           dCols = G^T @ W, folded back onto the input by ``aotc.Col2Im``
    dB = the sum of G over batch and positions

Groups are the batch of the products; depthwise convs have kernels of their own (depthwise.py). A float32
Conv with run-time weights is itself rewritten as im2col + GEMM before differentiation (``conv_as_gemm``),
and then differentiated by the MatMul and Im2Col rules, its columns shared with the weight gradient.
"""

from __future__ import annotations

from aotc.ir.graph import Node
from aotc.ops.conv.common import Geometry
from aotc.ops.grads.builder import GradBuilder, Grads, rule
from aotc.ops.grads.depthwise import depthwise
from aotc.ops.grads.pool import forward_attrs, forward_geometry
from aotc.ops.registry import OpDef, register


def _geometry(node: Node) -> Geometry:
    return forward_geometry("Conv", forward_attrs(node), node.attrs["x_shape"], node.attrs["w_shape"])


def _cols_shape(g: Geometry) -> tuple[int, int, int]:
    return g.group, g.n * g.out_size, g.c // g.group * g.taps


def _tap_loops(g: Geometry, body: list[str]) -> list[str]:
    """Loops over input channel c (of the group) and taps (kd, kh, kw) of output (od, oh, ow); ``j``
    is the column, ``inside`` whether the tap reads the input, ``i`` its offset in the input plane."""
    lines = [f"for (size_t c = 0; c < {g.c // g.group}; c++)",
             f"for (size_t kd = 0; kd < {g.k[0]}; kd++)", f"for (size_t kh = 0; kh < {g.k[1]}; kh++)",
             f"for (size_t kw = 0; kw < {g.k[2]}; kw++) {{",
             f"  const size_t j = ((c * {g.k[0]} + kd) * {g.k[1]} + kh) * {g.k[2]} + kw;"]
    for ax, (o, k, p) in enumerate((("od", "kd", "id"), ("oh", "kh", "ih"), ("ow", "kw", "iw"))):
        lines.append(f"  const ptrdiff_t {p} = (ptrdiff_t)({o} * {g.s[ax]} + {k} * {g.d[ax]}) - {g.pb[ax]};")
    lines += [f"  const int inside = id >= 0 && id < {g.inp[0]} && ih >= 0 && ih < {g.inp[1]} && iw >= 0 && "
              f"iw < {g.inp[2]};",
              f"  const size_t i = inside ? ((size_t)id * {g.inp[1]} + (size_t)ih) * {g.inp[2]} + (size_t)iw : 0;",
              *(f"  {line}" for line in body), "}"]
    return lines


def _rows(g: Geometry) -> list[str]:
    """Row r of the columns, (group, n, od, oh, ow), split from the flat row index."""
    return [f"const size_t grp = r / {g.n * g.out_size}, n = r / {g.out_size} % {g.n}, o = r % {g.out_size};",
            f"const size_t od = o / {g.out[1] * g.out[2]}, oh = o / {g.out[2]} % {g.out[1]}, ow = o % {g.out[2]};",
            f"const size_t plane = n * {g.c} + grp * {g.c // g.group};"]


def _im2col_infer(node: Node):
    return [(_cols_shape(_geometry(node)), node.inputs[0].dtype)]


def _im2col_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    g = _geometry(node)
    width = _cols_shape(g)[2]
    return "\n".join([f"for (size_t r = task; r < {g.group * g.n * g.out_size}; r += ntasks) {{",
                      *_rows(g), f"{ctype} *row = {outs[0]} + r * {width};",
                      *_tap_loops(g, [f"row[j] = inside ? {ins[0]}[(plane + c) * {g.in_size} + i] : 0;"]), "}"])


def _col2im_infer(node: Node):
    return [(tuple(node.attrs["x_shape"]), node.inputs[0].dtype)]


def _col2im_emit(node: Node, ins: list[str], outs: list[str], ctype: str) -> str:
    """Each task owns whole (group, n) blocks of input planes, so no two add into one element."""
    g = _geometry(node)
    width = _cols_shape(g)[2]
    cg = g.c // g.group
    return "\n".join([f"for (size_t blk = task; blk < {g.group * g.n}; blk += ntasks) {{",
                      f"const size_t grp = blk / {g.n}, n = blk % {g.n}, plane = n * {g.c} + grp * {cg};",
                      f"for (size_t i = 0; i < {cg * g.in_size}; i++) {outs[0]}[plane * {g.in_size} + i] = 0;",
                      f"for (size_t o = 0; o < {g.out_size}; o++) {{",
                      f"const size_t od = o / {g.out[1] * g.out[2]}, oh = o / {g.out[2]} % {g.out[1]}, "
                      f"ow = o % {g.out[2]};",
                      f"const {ctype} *row = {ins[0]} + (blk * {g.out_size} + o) * {width};",
                      *_tap_loops(g, [f"if (inside) {outs[0]}[(plane + c) * {g.in_size} + i] += row[j];"]),
                      "}", "}"])


register(OpDef("aotc.Im2Col", "kernel", _im2col_infer, emit=_im2col_emit))
register(OpDef("aotc.Col2Im", "kernel", _col2im_infer, emit=_col2im_emit))


@rule("Conv")
def _conv(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    x, w, gy = node.inputs[0], node.inputs[1], dys[0]
    assert x is not None and w is not None and gy is not None
    attrs = {**forward_attrs(node), "x_shape": list(x.shape), "w_shape": list(w.shape)}
    geo = forward_geometry("Conv", forward_attrs(node), list(x.shape), list(w.shape))
    grp, n, mg = geo.group, geo.n, geo.m // geo.group
    rows = n * geo.out_size
    gx = gw = gb = None
    if depthwise(node):
        gx = b.op("aotc.DepthwiseGradInput", gy, w, **attrs) if needs[0] else None
        gw = b.op("aotc.DepthwiseGradWeight", x, gy, **attrs) if needs[1] else None
        needs = [False, False, *needs[2:]]
    # G as [group, n, m, o]: the cotangent's channels split by group.
    g4 = b.reshape(gy, (n, grp, mg, geo.out_size))
    if needs[1]:
        cols = b.op("aotc.Im2Col", x, **attrs)
        gm = b.reshape(b.transpose(g4, [1, 2, 0, 3]), (grp, mg, rows))
        gw = b.reshape(b.op("MatMul", gm, cols), w.shape)
    if needs[0]:
        gt = b.reshape(b.transpose(g4, [1, 0, 3, 2]), (grp, rows, mg))
        wm = b.reshape(w, (grp, mg, w.size // geo.m))
        gx = b.op("aotc.Col2Im", b.op("MatMul", gt, wm), **attrs)
    if len(needs) > 2 and needs[2]:
        gb = b.reduce_sum(gy, [0, *range(2, len(gy.shape))], keepdims=False)
    return [gx, gw, gb]


@rule("aotc.Im2Col")
def _im2col(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    g = dys[0]
    assert g is not None
    return [b.op("aotc.Col2Im", g, **forward_attrs(node))]


def conv_as_gemm(b: GradBuilder, node: Node) -> None:
    """Rewrite Conv ``node`` as Im2Col, a GEMM with the weights and a bias add, in place: its output
    Value is then written by the last new node. For weights computed at run time (parameters being
    trained), which the conv kernels' fast paths do not take; the backward then shares the columns."""
    x, w = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    out = node.outputs[0]
    assert x is not None and w is not None
    geo = forward_geometry("Conv", forward_attrs(node), list(x.shape), list(w.shape))
    grp, mg = geo.group, geo.m // geo.group
    cols = b.op("aotc.Im2Col", x, **forward_attrs(node), x_shape=list(x.shape), w_shape=list(w.shape))
    wt = b.transpose(b.reshape(w, (grp, mg, w.size // geo.m)), [0, 2, 1])
    y = b.reshape(b.op("MatMul", cols, wt), (grp, geo.n, geo.out_size, mg))
    y = b.reshape(b.transpose(y, [1, 0, 3, 2]), out.shape)
    if bias is not None:
        y = b.add(y, b.reshape(bias, (geo.m, *[1] * (len(out.shape) - 2))))
    last = y.producer
    assert last is not None
    last.outputs[0], out.producer = out, last


@rule("ConvTranspose")
def _conv_transpose(b: GradBuilder, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    """y[n, g Mg + m, i s + k d - p] += x[n, g Cg + c, i] W[g Cg + c, m, k]: the cotangent unfolded by a
    conv's im2col over y (with the end padding that makes x's extent), dX = cols W^T and dW = X^T cols."""
    x, w, gy = node.inputs[0], node.inputs[1], dys[0]
    assert x is not None and w is not None and gy is not None
    geo = forward_geometry("ConvTranspose", forward_attrs(node), list(x.shape), list(w.shape))
    nd = len(x.shape) - 2
    grp, cg, n = geo.group, geo.c // geo.group, geo.n
    ek = [(geo.k[a] - 1) * geo.d[a] + 1 for a in range(3)]
    pe = [(geo.inp[a] - 1) * geo.s[a] + ek[a] - geo.out[a] - geo.pb[a] for a in range(3)]
    attrs = {"strides": list(geo.s[3 - nd:]), "dilations": list(geo.d[3 - nd:]), "group": grp,
             "pads": [*geo.pb[3 - nd:], *pe[3 - nd:]], "x_shape": list(gy.shape), "w_shape": list(w.shape)}
    cols = b.op("aotc.Im2Col", gy, **attrs)  # [G, N * Ox, Mg * K]
    rows = n * geo.in_size
    gx = gw = gb = None
    if needs[0]:
        wt = b.transpose(b.reshape(w, (grp, cg, w.size // geo.c)), [0, 2, 1])
        gx = b.reshape(b.op("MatMul", cols, wt), (grp, n, geo.in_size, cg))
        gx = b.reshape(b.transpose(gx, [1, 0, 3, 2]), x.shape)
    if needs[1]:
        xt = b.reshape(b.transpose(b.reshape(x, (n, grp, cg, geo.in_size)), [1, 2, 0, 3]), (grp, cg, rows))
        gw = b.reshape(b.op("MatMul", xt, cols), w.shape)
    if len(needs) > 2 and needs[2]:
        gb = b.reduce_sum(gy, [0, *range(2, len(gy.shape))], keepdims=False)
    return [gx, gw, gb]
