"""Quantized convolutions and GEMMs as integer kernels.

``fuse_qdq`` runs before shape inference, while the weights are still int8 constants behind their
DequantizeLinear. For the convs and GEMMs the int8 kernel takes (2-D, one group, int8 weights of zero
point 0), onnxruntime's QDQ form, ``DequantizeLinear(x) -> Conv(DequantizeLinear(w),
DequantizeLinear(int32 bias)) -> [Relu] -> QuantizeLinear``, becomes the one QLinearConv it stands
for, as onnxruntime's own QDQ transformer does (the int32 bias is the accumulator's, its scale
x_scale * w_scale); a Relu before the QuantizeLinear clamps at the output zero point (``_relu``).
MatMul and Gemm become QLinearMatMul the same way (a Gemm's bias as a 9th input). Other convs stay
float between their (de)quantizations, faster than QLinearConv's direct loop. A MaxPool between a
DequantizeLinear and a QuantizeLinear of the same scale and zero point pools the 8-bit values.

``lower_qlinear`` (after inference): a 2-D QLinearConv, or a QLinearMatMul, with constant int8
weights of zero point 0 and constant scales and zero points becomes ``aotc.QLinearConv``
(``aotc/ops/int8_conv.py``; a QLinearMatMul as a 1x1 conv whose pixels are its rows): weights packed
once for the dot-product kernels, the bias and the input zero point's correction folded into one
int32 per channel, the requantization multipliers computed as onnxruntime computes them.
"""

from __future__ import annotations

import numpy as np

from aotc.ir import dtypes
from aotc.ir.graph import Graph, Node, Value
from aotc.ops import int8_conv
from aotc.ops.integer import qconv_geometry
from aotc.passes.prune import replace_nodes

_QTYPES = (np.dtype(np.uint8), np.dtype(np.int8))


def _const(v: Value | None) -> np.ndarray | None:
    return v.const if v is not None and v.is_const else None


def _dq(v: Value | None) -> Node | None:
    """The DequantizeLinear producing ``v`` with constant scale and zero point (given)."""
    p = v.producer if v is not None else None
    if p is None or p.op != "DequantizeLinear" or len(p.inputs) < 3:
        return None
    if _const(p.inputs[1]) is None or _const(p.inputs[2]) is None or p.attr("block_size", 0):
        return None
    return p


def _only_user(v: Value, users: dict[int, list[Node]], fetched: set[int], op: str) -> Node | None:
    us = users.get(id(v), [])
    return us[0] if len(us) == 1 and us[0].op == op and id(v) not in fetched else None


def _dq_bias(v: Value | None, sx: np.ndarray, sw: np.ndarray) -> tuple[bool, np.ndarray | None]:
    """(usable, the int32 values) of a bias that is absent or the DequantizeLinear of constant int32s with
    zero point 0 and scale x_scale * w_scale (the accumulator's, as onnxruntime's quantizer writes it)."""
    if v is None:
        return True, None
    db = _dq(v)
    b = _const(db.inputs[0]) if db is not None else None
    if db is None or b is None or b.dtype != np.int32 or np.any(_const(db.inputs[2])):
        return False, None
    sb = _const(db.inputs[1])
    assert sb is not None
    want = (np.float32(sx.reshape(-1)[0]) * sw.reshape(-1)).astype(np.float32)
    if sb.size not in (1, want.size) or not np.allclose(sb.reshape(-1), want, rtol=1e-6, atol=0):
        return False, None
    return True, b.reshape(-1)


def _qdq_conv(conv: Node, users: dict[int, list[Node]], fetched: set[int]) -> tuple[Node, Node] | None:
    """(the QuantizeLinear to replace, the QLinearConv replacing it) for a QDQ conv, else None."""
    dx, dw = _dq(conv.inputs[0]), _dq(conv.inputs[1])
    if dx is None or dw is None or _const(dw.inputs[0]) is None:
        return None
    sx, zx = _const(dx.inputs[1]), _const(dx.inputs[2])
    w, sw, zw = _const(dw.inputs[0]), _const(dw.inputs[1]), _const(dw.inputs[2])
    assert sx is not None and zx is not None and w is not None and sw is not None and zw is not None
    # Only what the int8 kernel runs (2-D, one group, int8 weights of zero point 0): the direct loop of
    # QLinearConv is slower than the float conv between (de)quantizations that it would replace.
    if sx.size != 1 or zx.size != 1 or zx.dtype not in _QTYPES or w.dtype != np.int8 or w.ndim != 4 \
            or np.any(zw) or int(conv.attr("group", 1)) != 1 \
            or -(-w.shape[1] // 4) * 4 * w.shape[2] * w.shape[3] > int8_conv.MAX_PRODUCTS:
        return None
    if sw.size != 1 and (sw.size != w.shape[0] or int(dw.attr("axis", 1)) % w.ndim != 0):
        return None
    ok, bias = _dq_bias(conv.inputs[2] if len(conv.inputs) > 2 else None, sx, sw)
    if not ok:
        return None
    tail = _quantized_output(conv, users, fetched)
    if tail is None or sx.dtype != np.float32:
        return None
    q, relu = tail
    inputs = [dx.inputs[0], dx.inputs[1], dx.inputs[2], dw.inputs[0], dw.inputs[1], dw.inputs[2], q.inputs[1],
              q.inputs[2]] + ([Graph.constant(bias, f"{conv.name}/bias")] if bias is not None else [])
    attrs = {k: v for k, v in conv.attrs.items()} | ({"_relu": 1} if relu else {})
    return q, Node("QLinearConv", inputs, [q.outputs[0]], attrs, f"{conv.name}/qlinear")


def _qdq_maxpool(pool: Node, users: dict[int, list[Node]], fetched: set[int]) -> tuple[Node, Node] | None:
    """``DequantizeLinear(x) -> MaxPool -> QuantizeLinear`` with the same scale (> 0) and zero point is
    MaxPool on the 8-bit ``x``: the quantization is monotonic and gives back each integer exactly."""
    dx = _dq(pool.inputs[0])
    if dx is None or len(pool.outputs) != 1:
        return None
    q = _only_user(pool.outputs[0], users, fetched, "QuantizeLinear")
    if q is None or len(q.inputs) < 3 or _const(q.inputs[1]) is None or _const(q.inputs[2]) is None:
        return None
    s, z, sq, zq = _const(dx.inputs[1]), _const(dx.inputs[2]), _const(q.inputs[1]), _const(q.inputs[2])
    assert s is not None and z is not None and sq is not None and zq is not None
    if s.size != 1 or z.size != 1 or z.dtype not in _QTYPES or s.dtype != np.float32 or not s.reshape(-1)[0] > 0:
        return None
    if sq.size != 1 or zq.size != 1 or sq.dtype != s.dtype or zq.dtype != z.dtype \
            or sq.reshape(-1)[0] != s.reshape(-1)[0] or zq.reshape(-1)[0] != z.reshape(-1)[0]:
        return None
    return q, Node("MaxPool", [dx.inputs[0]], [q.outputs[0]], dict(pool.attrs), f"{pool.name}/uint8")


def _qdq_matmul(mm: Node, users: dict[int, list[Node]], fetched: set[int]) -> tuple[Node, Node] | None:
    """(the QuantizeLinear to replace, the QLinearMatMul replacing it) for a QDQ MatMul, or a Gemm
    (transA 0, alpha and beta 1) whose bias is an int32 DequantizeLinear, as a 9th input."""
    da, dw = _dq(mm.inputs[0]), _dq(mm.inputs[1])
    if da is None or dw is None or _const(dw.inputs[0]) is None:
        return None
    sa, za = _const(da.inputs[1]), _const(da.inputs[2])
    w, sw, zw = _const(dw.inputs[0]), _const(dw.inputs[1]), _const(dw.inputs[2])
    assert sa is not None and za is not None and w is not None and sw is not None and zw is not None
    gemm = mm.op == "Gemm"
    if gemm and (mm.attr("transA", 0) or mm.attr("alpha", 1.0) != 1.0 or mm.attr("beta", 1.0) != 1.0):
        return None
    if sa.size != 1 or za.size != 1 or za.dtype not in _QTYPES or w.dtype != np.int8 or w.ndim != 2 \
            or sa.dtype != np.float32 or np.any(zw):
        return None
    trans = gemm and bool(mm.attr("transB", 0))
    if -(-w.shape[1 if trans else 0] // 4) * 4 > int8_conv.MAX_PRODUCTS:
        return None
    n = w.shape[0 if trans else 1]
    if sw.size != 1 and (sw.size != n or int(dw.attr("axis", 1)) % 2 != (0 if trans else 1)):
        return None
    ok, bias = _dq_bias(mm.inputs[2] if gemm and len(mm.inputs) > 2 else None, sa, sw)
    if not ok or (bias is not None and bias.size != n):
        return None
    tail = _quantized_output(mm, users, fetched)
    if tail is None:
        return None
    q, relu = tail
    wv = Graph.constant(np.ascontiguousarray(w.T), f"{mm.name}/weights") if trans else dw.inputs[0]
    zwv = Graph.constant(zw.reshape(-1), f"{mm.name}/w_zero_point")
    swv = Graph.constant(sw.reshape(-1), f"{mm.name}/w_scale")
    inputs = [da.inputs[0], da.inputs[1], da.inputs[2], wv, swv, zwv, q.inputs[1], q.inputs[2]] + \
        ([Graph.constant(bias, f"{mm.name}/bias")] if bias is not None else [])
    return q, Node("QLinearMatMul", inputs, [q.outputs[0]], {"_opset": 10} | ({"_relu": 1} if relu else {}),
                   f"{mm.name}/qlinear")


def _quantized_output(node: Node, users: dict[int, list[Node]], fetched: set[int]) -> tuple[Node, bool] | None:
    """The QuantizeLinear (scalar float32 scale, 8-bit zero point) that alone reads ``node``'s output,
    maybe through a Relu, and whether there is one."""
    out, relu = node.outputs[0], False
    nxt = _only_user(out, users, fetched, "Relu")
    if nxt is not None:
        out, relu = nxt.outputs[0], True
    q = _only_user(out, users, fetched, "QuantizeLinear")
    if q is None or len(q.inputs) < 3 or _const(q.inputs[1]) is None or _const(q.inputs[2]) is None:
        return None
    sy, zy = _const(q.inputs[1]), _const(q.inputs[2])
    assert sy is not None and zy is not None
    if sy.size != 1 or zy.size != 1 or zy.dtype not in _QTYPES or sy.dtype != np.float32:
        return None
    return q, relu


def fuse_qdq(graph: Graph) -> bool:
    users = graph.consumers()
    fetched = {id(v) for v in graph.outputs}
    replaced: dict[int, Node] = {}
    for n in graph.nodes:
        if n.op in _QDQ:
            hit = _QDQ[n.op](n, users, fetched)
            if hit is not None:
                replaced[id(hit[0])] = hit[1]
    if not replaced:
        return False
    replace_nodes(graph, replaced)
    return True


def _consts(node: Node, idx: tuple[int, ...]) -> list[np.ndarray] | None:
    """The constant inputs ``idx`` of ``node``: scalar scales and zero points, int8 weights of zero point 0."""
    cs = [_const(node.inputs[i]) if i < len(node.inputs) else None for i in idx]
    if any(c is None for c in cs):
        return None
    sx, zx, w, sw, zw, sy, zy = cs  # type: ignore[misc]
    if w.dtype != np.int8 or np.any(zw) or sx.size != 1 or zx.size != 1 or sy.size != 1 or zy.size != 1:
        return None
    return cs  # type: ignore[return-value]


def _bias(node: Node, i: int) -> tuple[bool, np.ndarray | None]:
    """(usable, the constant int32 bias at input ``i`` or None if there is none)."""
    if len(node.inputs) <= i or node.inputs[i] is None:
        return True, None
    b = _const(node.inputs[i])
    return b is not None, b


def _int8_conv(x: Value, out: Value, w: np.ndarray, b: np.ndarray | None, params: list[np.ndarray], relu: bool,
               attrs: dict, name: str) -> Node | None:
    """``aotc.QLinearConv`` of ``x`` by int8 weights ``w`` [M, C, KH, KW] (2-D conv ``attrs``), scales and
    zero points ``params`` (x scale, x zero point, w scale, y scale, y zero point)."""
    sx, zx, sw, sy, zy = params
    m, c = w.shape[:2]
    flip = x.dtype == np.int8
    zero = int(zx.reshape(-1)[0]) + (128 if flip else 0)
    blocks = -(-m // int8_conv.BLOCK)
    wsum = w.reshape(m, -1).astype(np.int64).sum(axis=1)
    comp = np.zeros(blocks * int8_conv.BLOCK, np.int64)
    comp[:m] = (b.reshape(-1).astype(np.int64) if b is not None else 0) - zero * wsum
    mul = np.zeros(blocks * int8_conv.BLOCK, np.float32)
    scale = np.broadcast_to(sw.reshape(-1).astype(np.float32), (m,))
    mul[:m] = np.float32(sx.reshape(-1)[0]) * scale / np.float32(sy.reshape(-1)[0])  # in float, as onnxruntime
    info = np.iinfo(out.dtype)
    yzp = int(zy.reshape(-1)[0])
    attrs = attrs | {"m": m, "out_type": dtypes.onnx_type(out.dtype), "x_pad": zero, "flip": int(flip),
                     "y_zero_point": yzp, "lo": max(int(info.min), yzp) if relu else int(info.min),
                     "hi": int(info.max)}
    packed = Graph.constant(int8_conv.pack_weights(w, -(-c // 4) * 4), f"{name}/packed")
    cv = Graph.constant(((comp + 2**31) % 2**32 - 2**31).astype(np.int32), f"{name}/comp")
    new = Node("aotc.QLinearConv", [x, packed, cv, Graph.constant(mul, f"{name}/mul")], [out], attrs, name)
    return new if int8_conv.fits(new) else None


_QDQ = {"Conv": _qdq_conv, "MaxPool": _qdq_maxpool, "MatMul": _qdq_matmul, "Gemm": _qdq_matmul}


def _packed(node: Node) -> list[Node] | None:
    """The ``aotc.QLinearConv`` computing the QLinearConv ``node``, if its operands allow."""
    x = node.inputs[0]
    cs = _consts(node, (1, 2, 3, 4, 5, 6, 7))
    ok, b = _bias(node, 8)
    if x is None or x.shape is None or len(x.shape) != 4 or x.dtype not in _QTYPES or cs is None or not ok:
        return None
    sx, zx, w, sw, _, sy, zy = cs
    g = qconv_geometry(node)
    if g.group != 1 or g.k[0] != 1 or w.shape[0] != g.m:
        return None
    attrs = {"kernel_shape": [g.k[1], g.k[2]], "strides": [g.s[1], g.s[2]], "dilations": [g.d[1], g.d[2]],
             "pads": [g.pb[1], g.pb[2], g.pe[1], g.pe[2]]}
    conv = _int8_conv(x, node.outputs[0], w.reshape(g.m, g.c, g.k[1], g.k[2]), b, [sx, zx, sw, sy, zy],
                      bool(node.attr("_relu", 0)), attrs, node.name)
    return None if conv is None else [conv]


def _packed_matmul(node: Node) -> list[Node] | None:
    """A QLinearMatMul of activations [..., K] by constant int8 weights [K, N] as the same kernel: a 1x1
    conv over [1, K, 1, rows], between the transposes (and reshapes) that make the rows its pixels."""
    a, out = node.inputs[0], node.outputs[0]
    cs = _consts(node, (1, 2, 3, 4, 5, 6, 7))
    ok, b = _bias(node, 8)
    if a is None or a.shape is None or len(a.shape) < 2 or a.dtype not in _QTYPES or cs is None or not ok:
        return None
    sa, za, w, sw, _, sy, zy = cs
    k, rows = a.shape[-1], int(np.prod(a.shape[:-1]))
    if w.ndim != 2 or w.shape[0] != k or sw.size not in (1, w.shape[1]) or out.shape is None:
        return None
    n, name, nodes = w.shape[1], node.name, []

    def add(op: str, x: Value, shape: tuple[int, ...], **attrs) -> Value:
        v = Value(f"{name}/{op.lower()}{len(nodes)}", shape, x.dtype)
        ins = [x] + ([Graph.constant(np.array(shape, np.int64), f"{v.name}/shape")] if op == "Reshape" else [])
        nodes.append(Node(op, ins, [v], attrs, v.name))
        return v
    x = add("Reshape", a, (rows, k))
    x = add("Transpose", x, (k, rows), perm=[1, 0]) if rows > 1 else x
    x = add("Reshape", x, (1, k, 1, rows))
    y = Value(f"{name}/conv", (1, n, 1, rows), out.dtype)
    attrs = {"kernel_shape": [1, 1], "strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0]}
    conv = _int8_conv(x, y, np.ascontiguousarray(w.T).reshape(n, k, 1, 1), b, [sa, za, sw, sy, zy],
                      bool(node.attr("_relu", 0)), attrs, f"{name}/conv")
    if conv is None:
        return None
    nodes.append(conv)
    y = add("Reshape", y, (n, rows))
    y = add("Transpose", y, (rows, n), perm=[1, 0]) if rows > 1 else y
    final = Node("Reshape", [y, Graph.constant(np.array(out.shape, np.int64), f"{name}/out_shape")], [out], {},
                 f"{name}/out")
    return nodes + [final]


def lower_qlinear(graph: Graph) -> bool:
    changed = False
    nodes: list[Node] = []
    for n in graph.nodes:
        new = _packed(n) if n.op == "QLinearConv" else _packed_matmul(n) if n.op == "QLinearMatMul" else None
        if new is None:
            nodes.append(n)
            continue
        for m in new:
            for v in m.outputs:
                v.producer = m
        nodes += new
        changed = True
    graph.nodes = nodes
    return changed
